//! Issue 35, case 8: no key, no queue place; a client that reads nothing
//! is cut off and its slot freed. Over real sockets.

mod hostile;

use std::time::Duration;

use hostile::{
    CHAT, gate, patiently, post_raw, post_raw_with, recording_engine, sidecar, sidecar_with,
    totals, until,
};
use tower_admission::Counts;
use tower_admission_sidecar::{ApiKeys, ConnectionLimits};

#[tokio::test]
async fn without_a_valid_key_a_request_is_401_and_never_meets_the_gate() {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 1), &engine.url, |b| {
        b.api_keys(ApiKeys::new(["k-one", "k-two"]))
    })
    .await;
    let (status, head, _held) = post_raw_with(
        sidecar.address,
        "/v1/chat/completions",
        "authorization: Bearer k-one\r\n",
        CHAT,
    )
    .await;
    assert_eq!(status, 200, "{head}");
    // The gate is full but for one queue place: keyless clients take none.
    for headers in [
        "",
        "authorization: Bearer k-three\r\n",
        "authorization: Basic k-one\r\n",
        "x-api-key: k-on\r\n",
    ] {
        let (status, head, _) =
            post_raw_with(sidecar.address, "/v1/chat/completions", headers, CHAT).await;
        assert_eq!(status, 401, "{headers}: {head}");
        assert!(head.contains("www-authenticate: Bearer"), "{head}");
        assert!(head.contains("application/json"), "{head}");
    }
    assert_eq!(totals(&sidecar.gate).queued, 0);
    assert_eq!(sidecar.gate.snapshot().tally.rejected_worker, 0);
    // Anthropic's header counts too, and queues.
    let queued = tokio::spawn(post_raw_with(
        sidecar.address,
        "/v1/messages",
        "x-api-key: k-two\r\n",
        CHAT,
    ));
    until("the keyed request is queued", || {
        totals(&sidecar.gate).queued == 1
    })
    .await;
    // Health probes need no key; everything else does.
    let mut probe = tokio::net::TcpStream::connect(sidecar.address)
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut probe, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let head = patiently(hostile::read_head(&mut probe)).await;
    assert_eq!(hostile::status_of(&head), 200, "{head}");
    assert_eq!(post_raw(sidecar.address, "/tokenize", "{}").await.0, 401);
    assert_eq!(
        engine.seen.all(),
        ["POST /v1/chat/completions", "GET /health"]
    );
    queued.abort();
}

#[tokio::test]
async fn a_client_that_reads_nothing_is_cut_off_and_its_slot_freed() {
    let engine = recording_engine().await;
    let limits = ConnectionLimits::default().slow_reader_timeout(Duration::from_millis(500));
    let sidecar = sidecar_with(gate(1, 0), &engine.url, |b| b, limits).await;
    // The engine streams without end; the client reads the head only.
    let (status, head, _stalled) = post_raw(sidecar.address, "/flood", "{}").await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(totals(&sidecar.gate).engine_requests, 1);
    until("the slot of the client that reads nothing is freed", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    let (status, _, _) = post_raw(sidecar.address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
}

#[test]
fn the_binary_reads_keys_from_flags_and_a_file_and_never_prints_them() {
    let dir = std::env::temp_dir().join(format!("hostile-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, "# keys\nfile-key-1\n\n  file-key-2  \n").unwrap();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tower-admission"));
    let sidecar = tower_admission_testkit::Process::spawn(
        binary,
        &[
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
            "--max-num-seqs",
            "2",
            "--api-key",
            "flag-key",
            "--api-key-file",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let line = sidecar.wait_for_stdout("the limits", |text| {
        text.lines()
            .find(|line| line.starts_with("connections:"))
            .map(str::to_owned)
    });
    let url = sidecar.listening_url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let address: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let statuses = runtime.block_on(async {
        let mut statuses = Vec::new();
        for headers in [
            "",
            "authorization: Bearer flag-key\r\n",
            "authorization: Bearer file-key-2\r\n",
        ] {
            let (status, _, _) =
                post_raw_with(address, "/v1/chat/completions", headers, CHAT).await;
            statuses.push(status);
        }
        statuses
    });
    sidecar.terminate();
    // With a key the request reaches for the (absent) engine: 502.
    assert_eq!(statuses, [401, 502, 502]);
    assert!(line.contains("API keys: 3"), "{line}");
    let said = format!("{}{}", sidecar.stdout(), sidecar.stderr());
    for key in ["flag-key", "file-key-1", "file-key-2"] {
        assert!(!said.contains(key), "{key} printed:\n{said}");
    }
    let help = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--api-key", "--api-key-file", "--slow-reader-timeout-s"] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    get_with(address, path, "").await
}

async fn get_with(address: std::net::SocketAddr, path: &str, headers: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    patiently(stream.read_to_string(&mut answer)).await.unwrap();
    (hostile::status_of(&answer), answer)
}

#[tokio::test]
async fn metrics_on_their_own_address_serve_nothing_else() {
    let engine = recording_engine().await;
    let gate = gate(1, 1);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(tower_admission_sidecar::serve_metrics(
        listener,
        gate,
        std::sync::Arc::new(|| "gate_series 1\n".to_owned()),
        None,
        None,
        std::future::pending(),
    ));
    let (status, answer) = get(address, "/metrics").await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.ends_with("gate_series 1\n"), "{answer}");
    for path in ["/v1/models", "/health", "/metrics/../v1/models"] {
        assert_eq!(get(address, path).await.0, 404, "{path}");
    }
    let (status, _, _) = post_raw(address, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 404);
    assert!(engine.seen.all().is_empty());
}

#[test]
fn the_binary_serves_metrics_on_the_metrics_address_only() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tower-admission"));
    let sidecar = tower_admission_testkit::Process::spawn(
        binary,
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:1",
            "--max-num-seqs",
            "2",
        ],
        &[],
    );
    let metrics: std::net::SocketAddr = sidecar.wait_for_stdout("the metrics address", |text| {
        text.lines()
            .find_map(|line| line.strip_prefix("metrics: GET http://"))
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .map(|address| address.parse().unwrap())
    });
    let proxy: std::net::SocketAddr = sidecar
        .listening_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (on_metrics, on_proxy) =
        runtime.block_on(async { (get(metrics, "/metrics").await, get(proxy, "/metrics").await) });
    sidecar.terminate();
    assert_eq!(on_metrics.0, 200, "{}", on_metrics.1);
    assert!(on_metrics.1.contains("# TYPE"), "{}", on_metrics.1);
    // On the proxy's address /metrics is the engine's (absent here).
    assert_eq!(on_proxy.0, 502, "{}", on_proxy.1);
}

/// Requests of key `a` queue first, then one of key `b`; the engine's order
/// of service with and without a tenant per key.
async fn order_of_service(tenant_per_key: bool) -> Vec<String> {
    let engine = recording_engine().await;
    let sidecar = sidecar(gate(1, 10), &engine.url, |b| {
        b.api_keys(ApiKeys::new(["a", "b"]))
            .tenant_from_api_key(tenant_per_key)
    })
    .await;
    let running = post_raw_with(
        sidecar.address,
        "/v1/chat/completions",
        "authorization: Bearer a\r\n",
        CHAT,
    )
    .await;
    assert_eq!(running.0, 200);
    let mut waiting = Vec::new();
    for (queued, (key, path)) in [
        ("a", "/quick/a1"),
        ("a", "/quick/a2"),
        ("a", "/quick/a3"),
        ("b", "/quick/b1"),
    ]
    .into_iter()
    .enumerate()
    {
        let header = format!("authorization: Bearer {key}\r\n");
        let address = sidecar.address;
        waiting.push(tokio::spawn(async move {
            post_raw_with(address, path, &header, "{}").await.0
        }));
        until("queued in order", || {
            totals(&sidecar.gate).queued == queued + 1
        })
        .await;
    }
    // The running request's client leaves: the queue is served in order.
    drop(running);
    for waiting in waiting {
        assert_eq!(patiently(waiting).await.unwrap(), 200);
    }
    engine.seen.all()
}

#[tokio::test]
async fn with_a_tenant_per_key_one_key_cannot_take_everyone_s_queue() {
    let fair = order_of_service(true).await;
    assert_eq!(
        fair[1..],
        [
            "POST /quick/a1",
            "POST /quick/b1",
            "POST /quick/a2",
            "POST /quick/a3"
        ],
        "{fair:?}"
    );
    // Without it, one queue in arrival order: key b waits for all of a.
    let fifo = order_of_service(false).await;
    assert_eq!(
        fifo[1..],
        [
            "POST /quick/a1",
            "POST /quick/a2",
            "POST /quick/a3",
            "POST /quick/b1"
        ],
        "{fifo:?}"
    );
}

/// The sidecar binary with `args` in front of `engine`, and its address.
fn spawn_binary(args: &[&str]) -> (tower_admission_testkit::Process, std::net::SocketAddr) {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tower-admission"));
    let sidecar = tower_admission_testkit::Process::spawn(binary, args, &[]);
    sidecar.wait_for_stdout("the limits", |text| {
        text.lines()
            .find(|line| line.starts_with("connections:"))
            .map(drop)
    });
    let address = sidecar
        .listening_url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    (sidecar, address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_names_tenants_so_their_limits_apply_to_their_keys() {
    let engine = recording_engine().await;
    let dir = std::env::temp_dir().join(format!("named-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(
        &file,
        "# tenant key\nacme k-acme-1\nacme\tk-acme-2\nk-anonymous\n",
    )
    .unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        engine.url.as_str(),
        "--max-num-seqs",
        "8",
        "--api-key-file",
        file.to_str().unwrap(),
        "--tenant-from-api-key",
        "--tenant-limit",
        "acme=1::0",
    ];
    let (sidecar, address) = tokio::task::block_in_place(|| spawn_binary(&args));
    let chat = |key: &str| {
        let header = format!("authorization: Bearer {key}\r\n");
        async move { post_raw_with(address, "/v1/chat/completions", &header, CHAT).await }
    };
    // acme's first key takes acme's one engine slot (the engine holds the
    // stream open); its second key is acme too: no queue place, 429.
    let (status, head, _held) = chat("k-acme-1").await;
    assert_eq!(status, 200, "{head}");
    let (status, head, _) = chat("k-acme-2").await;
    assert_eq!(status, 429, "{head}");
    assert!(
        head.contains("x-admission-rejection-reason: tenant_limit"),
        "{head}"
    );
    assert!(
        head.contains("x-admission-rejection-scope: tenant"),
        "{head}"
    );
    // A key without a name is a tenant of its own, not bound by acme's limit.
    let (status, head, _held_too) = chat("k-anonymous").await;
    assert_eq!(status, 200, "{head}");
    let (status, metrics) =
        get_with(address, "/metrics", "authorization: Bearer k-anonymous\r\n").await;
    sidecar.terminate();
    assert_eq!(status, 200);
    // The rejection is acme's, by name, in the client view's label.
    assert!(
        metrics
            .lines()
            .any(|line| line.contains("tenant_class=\"acme\"") && !line.starts_with('#')),
        "{metrics}"
    );
    let said = format!("{}{}", sidecar.stdout(), sidecar.stderr());
    for key in ["k-acme-1", "k-acme-2", "k-anonymous"] {
        assert!(!said.contains(key), "{key} printed:\n{said}");
    }

    // A line the sidecar cannot read stops it, naming the line, not the key.
    let refusal = |keys: &str| {
        std::fs::write(&file, keys).unwrap();
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_tower-admission"));
        let refused = std::process::Command::new(binary)
            .args(["--upstream", "http://127.0.0.1:1", "--max-num-seqs", "2"])
            .args(["--api-key-file", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!refused.status.success());
        String::from_utf8_lossy(&refused.stderr).into_owned()
    };
    let error = refusal("acme k-acme-1\nacme k-acme-2 extra\n");
    assert!(
        error.contains("line 2: expected KEY or TENANT KEY, found 3 fields"),
        "{error}"
    );
    assert!(!error.contains("k-acme"), "{error}");
    let error = refusal(&format!("{} k\n", "t".repeat(257)));
    assert!(error.contains("invalid tenant name"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

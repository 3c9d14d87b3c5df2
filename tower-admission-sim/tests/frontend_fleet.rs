//! The frontend example over three example workers, as processes over real
//! sockets. One worker is tiny (`--max-num-seqs 1 --request-queue-limit 0`):
//! in a burst it rejects with worker scope. Talking to the workers
//! round-robin, the client gets those `529`s; through the frontend, the
//! tiny worker leaves rotation at its first rejection, its rejected
//! requests are retried on the others, and the client sees fewer. Either
//! way each request is run by an engine at most once: the workers' own
//! counts of admissions and completions match the client's `200`s.

use tower_admission_testkit::exposition;
mod support;

#[path = "support/frontend.rs"]
mod fleet;

use serde_json::json;

use exposition::{Exposition, scrape};
use fleet::Frontend;
use support::{Server, within};

/// Requests in the burst.
const BURST: usize = 24;

/// Long enough (about 2.4 s at `--time-scale 4`) that the whole burst
/// arrives while the first requests still run.
const MAX_TOKENS: u64 = 100;

/// Two workers with room for the whole burst between them (4 running and
/// 12 queued each) and a tiny one.
fn workers() -> [Server; 3] {
    let roomy = [
        "--max-num-seqs",
        "4",
        "--request-queue-limit",
        "12",
        "--time-scale",
        "4",
    ];
    let tiny = [
        "--max-num-seqs",
        "1",
        "--request-queue-limit",
        "0",
        "--time-scale",
        "4",
    ];
    [
        support::server("openai_server", &roomy, &[]),
        support::server("openai_server", &roomy, &[]),
        support::server("openai_server", &tiny, &[]),
    ]
}

/// Sends the burst at once, request `i` to `targets[i % targets.len()]`,
/// and returns each answer's status.
async fn burst(client: &reqwest::Client, targets: &[&str]) -> Vec<u16> {
    let body = json!({"model": "sim", "prompt": "Tell me about admission control.", "max_tokens": MAX_TOKENS});
    let calls: Vec<_> = (0..BURST)
        .map(|i| {
            let request = client
                .post(format!("{}/v1/completions", targets[i % targets.len()]))
                .json(&body);
            tokio::spawn(async move {
                let response = within(request.send()).await.expect("no answer");
                let status = response.status().as_u16();
                within(response.bytes()).await.expect("body cut short");
                status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.unwrap());
    }
    statuses
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// What the workers' gates and engines counted, summed over the workers.
struct Engines {
    received: f64,
    admitted: f64,
    rejected: f64,
    completed: f64,
}

fn engines(scrapes: &[Exposition]) -> Engines {
    let sum = |name: &str| scrapes.iter().map(|scrape| scrape.sum(name, &[])).sum();
    Engines {
        received: sum("admission_request_receive_total"),
        admitted: sum("admission_request_admit_total"),
        rejected: sum("admission_rejection_total"),
        completed: sum("sim_engine_completed_total"),
    }
}

async fn scrape_all(client: &reqwest::Client, workers: &[Server]) -> Vec<Exposition> {
    let mut scrapes = Vec::new();
    for worker in workers {
        scrapes.push(within(scrape(client, &worker.url)).await);
    }
    scrapes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frontend_moves_traffic_off_a_tiny_worker_and_the_client_sees_fewer_overloads() {
    let client = reqwest::Client::new();

    // Round-robin without the frontend: the tiny worker runs one of its
    // eight requests and rejects seven; the others run or queue theirs.
    let direct = workers();
    let urls: Vec<&str> = direct.iter().map(|worker| worker.url.as_str()).collect();
    let statuses = burst(&client, &urls).await;
    let direct_overloaded = count(&statuses, 529);
    assert_eq!(
        count(&statuses, 200) + direct_overloaded,
        BURST,
        "{statuses:?}"
    );
    assert_eq!(
        direct_overloaded,
        BURST / 3 - 1,
        "round-robin: {statuses:?}"
    );
    let counted = engines(&scrape_all(&client, &direct).await);
    assert_eq!(counted.received, BURST as f64);
    assert_eq!(counted.admitted, count(&statuses, 200) as f64);
    assert_eq!(counted.completed, count(&statuses, 200) as f64);
    drop(direct);

    // The same burst through the frontend, over fresh workers.
    let fleet = workers();
    let urls: Vec<&str> = fleet.iter().map(|worker| worker.url.as_str()).collect();
    let frontend = Frontend::start(&urls);
    let statuses = burst(&client, &[frontend.url.as_str()]).await;
    let routed_overloaded = count(&statuses, 529);
    let ok = count(&statuses, 200);
    assert_eq!(ok + routed_overloaded, BURST, "{statuses:?}");
    println!(
        "529s seen by the client: {direct_overloaded} of {BURST} round-robin, \
         {routed_overloaded} of {BURST} through the frontend"
    );
    assert!(
        routed_overloaded < direct_overloaded,
        "the frontend let {routed_overloaded} overload answers through, round-robin got \
         {direct_overloaded}"
    );

    let routing = within(scrape(&client, &frontend.url)).await;
    let tiny = fleet[2].url.strip_prefix("http://").unwrap();
    let retries = routing.sum("frontend_retries_total", &[]);
    println!(
        "frontend: {retries} retries; tiny worker: {} requests, {} worker-scoped rejections, \
         {} cooldowns",
        routing.sum("frontend_worker_requests_total", &[("worker", tiny)]),
        routing.sum(
            "frontend_worker_rejections_total",
            &[("worker", tiny), ("scope", "worker")]
        ),
        routing.sum("frontend_worker_cooldowns_total", &[("worker", tiny)]),
    );
    assert!(
        routing.sum(
            "frontend_worker_rejections_total",
            &[("worker", tiny), ("scope", "worker")]
        ) >= 1.0,
        "the tiny worker never rejected: nothing was moved\n{}",
        routing.text
    );
    assert!(routing.sum("frontend_worker_cooldowns_total", &[("worker", tiny)]) >= 1.0);
    assert!(retries >= 1.0, "no rejection was retried\n{}", routing.text);
    assert_eq!(routing.sum("frontend_requests_total", &[]), BURST as f64);
    assert_eq!(
        routing.sum("frontend_responses_total", &[("status", "200")]),
        ok as f64
    );

    // Nothing lost, nothing run twice: every send reached a gate; each
    // request the client saw succeed was admitted and completed by exactly
    // one engine, and no other request was.
    let scrapes = scrape_all(&client, &fleet).await;
    let counted = engines(&scrapes);
    assert_eq!(counted.received, BURST as f64 + retries);
    assert_eq!(counted.admitted + counted.rejected, counted.received);
    assert_eq!(counted.admitted, ok as f64, "admissions and 200s differ");
    assert_eq!(counted.completed, ok as f64, "completions and 200s differ");
    let routed: f64 = fleet
        .iter()
        .map(|worker| {
            let label = worker.url.strip_prefix("http://").unwrap();
            routing.sum("frontend_worker_requests_total", &[("worker", label)])
        })
        .sum();
    assert_eq!(routed, counted.received, "sends the frontend counted");
    // The tiny engine ran one request of the burst; the others ran the rest.
    assert_eq!(scrapes[2].sum("admission_request_admit_total", &[]), 1.0);
}

#[tokio::test]
async fn the_frontend_answers_its_own_routes_routes_around_a_vacant_worker_and_refuses_bad_urls() {
    let worker = support::server("openai_server", &[], &[]);
    let frontend = Frontend::start(&[&worker.url]);
    let client = reqwest::Client::new();

    let health = within(client.get(format!("{}/health", frontend.url)).send())
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let missing = within(client.get(format!("{}/v1/models", frontend.url)).send())
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let error: serde_json::Value = within(missing.json()).await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");

    // A streamed chat answer comes through whole.
    let answer = within(
        client
            .post(format!("{}/v1/chat/completions", frontend.url))
            .json(&json!({
                "model": "sim",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
                "stream": true
            }))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = within(answer.text()).await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(text.matches("\"content\":\" ").count(), 3, "{text}");

    for bad in [
        "https://127.0.0.1:1",
        "127.0.0.1:8001",
        "http://127.0.0.1:8001/v1",
    ] {
        let mut process = support::Process::spawn(
            &fleet::frontend_binary(),
            &["--listen", "127.0.0.1:0", "--worker", bad],
            &[],
        );
        let (status, _, stderr) = process.wait();
        assert_eq!(status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--worker"), "{bad}: {stderr}");
    }
    let mut process =
        support::Process::spawn(&fleet::frontend_binary(), &["--listen", "127.0.0.1:0"], &[]);
    let (status, _, stderr) = process.wait();
    assert_eq!(status.code(), Some(2), "{stderr}");
}

/// Starts a streaming completion of `tokens` tokens at `url` with
/// `headers`, and returns its response once the head has arrived.
async fn streaming(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    tokens: u64,
) -> reqwest::Response {
    let body = json!({"model": "sim", "prompt": "Hi", "max_tokens": tokens, "stream": true});
    let mut request = client.post(format!("{url}/v1/completions")).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    within(request.send()).await.expect("no answer")
}

/// Waits until the worker's queue holds `queued` requests.
async fn queue_holds(client: &reqwest::Client, worker: &Server, queued: f64) {
    let deadline = tokio::time::Instant::now() + support::PATIENCE;
    loop {
        let scrape = within(scrape(client, &worker.url)).await;
        if scrape.sum("admission_request_queue_count", &[]) == queued {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queue never held {queued}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_a_client_forges_has_no_effect_through_the_frontend() {
    let client = reqwest::Client::new();
    // One engine slot and one queue place, priorities in two bands: an
    // arrival of priority 10 displaces a queued request of priority 0.
    let worker = support::server(
        "openai_server",
        &[
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "1",
            "--priority-bands",
            "0,10",
            "--time-scale",
            "4",
            "--max-model-len",
            "1000000",
        ],
        &[],
    );
    let frontend = Frontend::start_with(&[&worker.url], &["--api-key", "vip-key=vip:10"]);

    let running = streaming(&client, &frontend.url, &[], support::FOREVER).await;
    assert_eq!(running.status(), 200);
    // Straight to the worker, priority 0: it waits in the queue.
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), worker.url.clone());
        async move { streaming(&client, &url, &[("x-admission-priority", "0")], 4).await }
    });
    queue_holds(&client, &worker, 1.0).await;

    // A forged top priority through the frontend: removed there, so it
    // cannot displace the queued request; the queue is full, and after
    // the frontend's retries the client gets the worker's 529.
    let forged = streaming(
        &client,
        &frontend.url,
        &[
            ("x-admission-priority", "10"),
            ("x-admission-tenant", "vip"),
        ],
        4,
    )
    .await;
    assert_eq!(forged.status(), 529);
    assert_eq!(
        forged.headers()["x-admission-rejection-reason"],
        "queue_full"
    );
    assert!(!queued.is_finished(), "the queued request was displaced");
    queue_holds(&client, &worker, 1.0).await;

    // The priority the frontend trusts (the API key's) does displace it:
    // the same mechanism, from the only source allowed to use it.
    let vip = tokio::spawn({
        let (client, url) = (client.clone(), frontend.url.clone());
        async move { streaming(&client, &url, &[("authorization", "Bearer vip-key")], 4).await }
    });
    let displaced = within(queued).await.unwrap();
    assert_eq!(displaced.status(), 529);
    assert_eq!(
        displaced.headers()["x-admission-rejection-reason"],
        "displaced"
    );
    drop(running);
    let vip = within(vip).await.unwrap();
    let status = vip.status();
    let body = within(vip.text()).await.unwrap();
    assert_eq!(status, 200, "{body}");
}

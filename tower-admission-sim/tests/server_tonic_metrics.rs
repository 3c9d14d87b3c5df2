//! The tonic example's `/metrics` endpoint (`serve --metrics-listen`): a
//! separate port, outside the gRPC server and its gate, that shows the
//! gate's series as Prometheus text, follows the calls its own client
//! makes, and still answers while the worker rejects calls as overloaded.

use tower_admission_testkit::exposition;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use exposition::{Exposition, FAMILIES};
use support::{FOREVER, Process};

/// One scrape: the status line, the content type, and the exposition.
struct Scrape {
    status: String,
    content_type: String,
    metrics: Exposition,
}

impl Scrape {
    /// `GET /metrics` over a plain TCP connection (HTTP/1.1, closed after
    /// the answer).
    fn get(address: &str) -> Scrape {
        let mut stream = TcpStream::connect(address).expect("connect to the metrics endpoint");
        stream
            .set_read_timeout(Some(support::PATIENCE))
            .expect("set a read timeout");
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .expect("send the request");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read the answer");
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end in {answer:?}"));
        let status = head.lines().next().unwrap_or_default().to_owned();
        let content_type = head
            .lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .map(|(_, value)| value.trim().to_owned())
            .unwrap_or_default();
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            unchunk(body)
        } else {
            body.to_owned()
        };
        Scrape {
            status,
            content_type,
            metrics: Exposition::parse(&body),
        }
    }

    #[track_caller]
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metrics.value(name, labels)
    }
}

/// The body of a chunked HTTP/1.1 answer.
fn unchunk(mut body: &str) -> String {
    let mut text = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return text;
        }
        text.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

#[test]
fn the_tonic_example_serves_the_gates_metrics_on_a_separate_port() {
    let mut server = support::server(
        "tonic_server",
        &[
            "serve",
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "0",
            "--max-model-len",
            "1000000",
            "--metrics-prefix",
            "tonic",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let metrics = server
        .process
        .wait_for_stdout("the metrics address", |text| {
            text.lines()
                .find_map(|line| line.strip_prefix("metrics on http://"))
                .and_then(|rest| rest.strip_suffix("/metrics"))
                .map(str::to_owned)
        });
    let url = server.url.clone();
    assert_ne!(
        url.trim_start_matches("http://"),
        metrics,
        "a separate port"
    );

    // Before any call: every family, typed, under the chosen prefix.
    let scrape = Scrape::get(&metrics);
    assert_eq!(scrape.status, "HTTP/1.1 200 OK");
    assert!(
        scrape.content_type.starts_with("text/plain"),
        "{}",
        scrape.content_type
    );
    for (suffix, kind) in FAMILIES {
        assert_eq!(
            scrape.metrics.types.get(&format!("tonic_{suffix}")),
            Some(&kind.to_owned()),
            "tonic_{suffix}:\n{}",
            scrape.metrics.text
        );
    }
    let unranked = [("dp_rank", "unspecified")];
    assert_eq!(scrape.value("tonic_request_receive_total", &unranked), 0.0);
    // The engine reported one rank of one sequence.
    assert_eq!(
        scrape.value("tonic_engine_request_limit", &[("dp_rank", "0")]),
        1.0
    );

    // A whole call: received, admitted at once, waited for its first
    // message.
    let (status, _, stderr) = support::run(
        "tonic_server",
        &["client", "--addr", &url, "--max-tokens", "3"],
    );
    assert!(status.success(), "{status}: {stderr}");
    let scrape = Scrape::get(&metrics);
    assert_eq!(scrape.value("tonic_request_receive_total", &unranked), 1.0);
    assert_eq!(
        scrape.value(
            "tonic_request_admit_total",
            &[("dp_rank", "unspecified"), ("source", "direct")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value(
            "tonic_engine_request_waiting_seconds_count",
            &[("dp_rank", "unspecified")]
        ),
        1.0,
        "a histogram, with the waiting time of the call"
    );
    assert_eq!(scrape.value("tonic_engine_request_count", &unranked), 0.0);

    // One call streams and holds the only sequence; the next is rejected
    // for the whole worker, and the endpoint still answers.
    let streaming = Process::spawn(
        &support::example("tonic_server"),
        &[
            "client",
            "--addr",
            &url,
            "--max-tokens",
            &FOREVER.to_string(),
        ],
        &[],
    );
    streaming.wait_for_stdout("a token", |text| (!text.trim().is_empty()).then_some(()));
    let (status, stdout, stderr) = support::run(
        "tonic_server",
        &["client", "--addr", &url, "--max-tokens", "3"],
    );
    assert_eq!(status.code(), Some(3), "{stdout}\n{stderr}");
    let scrape = Scrape::get(&metrics);
    assert_eq!(scrape.status, "HTTP/1.1 200 OK");
    assert_eq!(scrape.value("tonic_engine_request_count", &unranked), 1.0);
    assert_eq!(
        scrape.value(
            "tonic_rejection_total",
            &[("dp_rank", "unspecified"), ("scope", "worker")]
        ),
        1.0
    );
    assert_eq!(scrape.value("tonic_request_receive_total", &unranked), 3.0);

    // A second server cannot take the metrics address: startup fails and
    // names the flag.
    let (status, _, stderr) = support::run(
        "tonic_server",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            &metrics,
        ],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("--metrics-listen") && stderr.contains(&metrics),
        "{stderr}"
    );

    // The streaming client goes away: its capacity comes back.
    drop(streaming);
    let deadline = std::time::Instant::now() + support::PATIENCE;
    loop {
        let scrape = Scrape::get(&metrics);
        if scrape.value("tonic_engine_request_count", &unranked) == 0.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held call never ended:\n{}",
            scrape.metrics.text
        );
        // The poll interval; the condition above is what the test waits for.
        std::thread::sleep(Duration::from_millis(10));
    }
    server.process.terminate();
    let (status, _, stderr) = server.process.wait();
    assert!(status.success(), "{status}: {stderr}");
}

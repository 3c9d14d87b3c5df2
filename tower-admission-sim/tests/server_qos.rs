//! Quality of service (behaviour §8) over real sockets, against the example
//! OpenAI server run as its users run it: priorities and tenants come from
//! the `x-admission-priority` and `x-admission-tenant` headers, the QoS
//! flags and variables configure it and show in its banner.
//!
//! The server runs one request at a time (`--max-num-seqs 1`), so the
//! order of service is the order in which its handler starts answering:
//! it numbers its answers as it does (the last eight hex digits of each
//! answer's `id` count up from 0 in the process), and one request starts
//! only after the one before has ended. Every step waits for an event: an
//! answer, or the gate's queue count on `/metrics` reaching the number the
//! step needs, so each request is known to be queued before the next one
//! is sent.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use support::{FOREVER, PATIENCE, Server, within};

/// A server that runs one request at a time, with `queue` queue places.
fn one_at_a_time(queue: usize, more: &[&str], env: &[(&str, &str)]) -> Server {
    let queue = queue.to_string();
    let mut args = vec![
        "--max-num-seqs",
        "1",
        "--request-queue-limit",
        &queue,
        "--max-model-len",
        "1000000",
    ];
    args.extend_from_slice(more);
    support::server("openai_server", &args, env)
}

/// A whole answer, with the label of the request it answers.
#[derive(Debug)]
struct Answer {
    label: &'static str,
    status: u16,
    reason: Option<String>,
    body: Value,
}

impl Answer {
    /// Where the server's handler took this request in its order of
    /// service: the counter at the end of the answer's `id`.
    fn served_as(&self) -> u64 {
        assert_eq!(self.status, 200, "{self:?}");
        let id = self.body["id"].as_str().expect("an answer has an id");
        let counter = &id[id.len() - 8..];
        u64::from_str_radix(counter, 16).unwrap_or_else(|_| panic!("id {id:?}"))
    }
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    fn new(server: &Server) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: server.url.clone(),
        }
    }

    /// Sends a short chat request with `headers` from its own task; the
    /// handle gives its whole answer.
    fn send(&self, label: &'static str, headers: &[(&str, &str)]) -> JoinHandle<Answer> {
        let mut request = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&json!({
                "model": "sim",
                "messages": [{"role": "user", "content": "Which of us goes first?"}],
                "max_tokens": 2,
            }));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        tokio::spawn(async move {
            let response = request.send().await.expect("the request failed");
            let status = response.status().as_u16();
            let reason = response
                .headers()
                .get("x-admission-rejection-reason")
                .map(|value| value.to_str().unwrap().to_owned());
            let text = response.text().await.expect("the body failed");
            let body = serde_json::from_str(&text)
                .unwrap_or_else(|error| panic!("not JSON ({error}): {text:?}"));
            Answer {
                label,
                status,
                reason,
                body,
            }
        })
    }

    /// Sends a request with `headers` and waits until the gate holds it in
    /// its queue, `queued` requests in all.
    async fn enqueue(
        &self,
        label: &'static str,
        headers: &[(&str, &str)],
        queued: usize,
    ) -> JoinHandle<Answer> {
        let answer = self.send(label, headers);
        self.wait_until_queued(queued).await;
        answer
    }

    /// Opens a chat stream that runs until dropped, and reads it up to its
    /// first token: the engine's one place is taken.
    async fn hold(&self) -> reqwest::Response {
        let mut response = within(
            self.http
                .post(format!("{}/v1/chat/completions", self.url))
                .json(&json!({
                    "model": "sim",
                    "messages": [{"role": "user", "content": "Take your time."}],
                    "max_tokens": FOREVER,
                    "stream": true,
                }))
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        // The role chunk, then the first token's chunk.
        let mut seen = String::new();
        while seen.matches("data:").count() < 2 {
            let chunk = within(response.chunk())
                .await
                .unwrap()
                .expect("the stream ended");
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        response
    }

    /// Requests waiting in the gate's queue, from `/metrics`: the sum of
    /// the queue count's series per `dp_rank` (or, should there be only
    /// series per `priority` band too, of those).
    async fn queued(&self) -> usize {
        let response = within(self.http.get(format!("{}/metrics", self.url)).send())
            .await
            .unwrap();
        let text = within(response.text()).await.unwrap();
        let series: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("admission_request_queue_count{"))
            .collect();
        let per_rank: Vec<&str> = series
            .iter()
            .copied()
            .filter(|line| !line.contains("priority="))
            .collect();
        let counted = if per_rank.is_empty() {
            series
        } else {
            per_rank
        };
        counted
            .iter()
            .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum::<f64>() as usize
    }

    async fn wait_until_queued(&self, expected: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let queued = self.queued().await;
            if queued == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{queued} queued, waiting for {expected}"
            );
            // The poll interval; the count above is what the test waits for.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The labels of `answers` in the order the server served them.
async fn order_of_service(answers: Vec<JoinHandle<Answer>>) -> Vec<&'static str> {
    let mut served = Vec::new();
    for answer in answers {
        let answer = within(answer).await.unwrap();
        served.push((answer.served_as(), answer.label));
    }
    served.sort_unstable();
    served.into_iter().map(|(_, label)| label).collect()
}

fn priority(value: &'static str) -> [(&'static str, &'static str); 1] {
    [("x-admission-priority", value)]
}

fn tenant(value: &'static str) -> [(&'static str, &'static str); 1] {
    [("x-admission-tenant", value)]
}

#[tokio::test]
async fn higher_priority_requests_are_served_before_older_lower_ones() {
    let server = one_at_a_time(8, &[], &[]);
    let client = Client::new(&server);
    let running = client.hold().await;
    let mut answers = Vec::new();
    for (queued, label) in ["L1", "L2", "L3"].into_iter().enumerate() {
        answers.push(client.enqueue(label, &priority("0"), queued + 1).await);
    }
    for (queued, label) in ["H1", "H2"].into_iter().enumerate() {
        answers.push(client.enqueue(label, &priority("5"), queued + 4).await);
    }
    drop(running);
    assert_eq!(
        order_of_service(answers).await,
        ["H1", "H2", "L1", "L2", "L3"]
    );
}

/// With one request running, tenant x queues X1..X4 and then tenant y
/// Y1, Y2; then the running request ends. The answers, in sending order.
async fn x_queues_four_then_y_two(client: &Client) -> Vec<JoinHandle<Answer>> {
    let running = client.hold().await;
    let mut answers = Vec::new();
    for (queued, label) in ["X1", "X2", "X3", "X4"].into_iter().enumerate() {
        answers.push(client.enqueue(label, &tenant("x"), queued + 1).await);
    }
    for (queued, label) in ["Y1", "Y2"].into_iter().enumerate() {
        answers.push(client.enqueue(label, &tenant("y"), queued + 5).await);
    }
    drop(running);
    answers
}

#[tokio::test]
async fn tenants_of_one_priority_take_turns() {
    let server = one_at_a_time(8, &[], &[]);
    let client = Client::new(&server);
    let answers = x_queues_four_then_y_two(&client).await;
    assert_eq!(
        order_of_service(answers).await,
        ["X1", "Y1", "X2", "Y2", "X3", "X4"]
    );
}

#[tokio::test]
async fn a_tenant_weight_from_the_command_line_gives_that_tenant_more_turns() {
    let server = one_at_a_time(8, &["--tenant-weight", "x=3"], &[]);
    let client = Client::new(&server);
    let answers = x_queues_four_then_y_two(&client).await;
    // Weighing 3, x's requests start a third of a turn apart, y's a whole
    // turn: Y2 waits until X2..X4 have had theirs (equal weights serve it
    // before X3, as above).
    assert_eq!(
        order_of_service(answers).await,
        ["X1", "Y1", "X2", "X3", "X4", "Y2"]
    );
}

#[tokio::test]
async fn priorities_within_one_configured_band_are_served_first_come_first_served() {
    let server = one_at_a_time(8, &["--priority-bands", "0,10"], &[]);
    let client = Client::new(&server);
    let running = client.hold().await;
    let answers = vec![
        client.enqueue("P0", &priority("0"), 1).await,
        client.enqueue("P5", &priority("5"), 2).await,
        client.enqueue("P10", &priority("10"), 3).await,
        client.enqueue("P9", &priority("9"), 4).await,
    ];
    drop(running);
    // Band 10, then band 0 (priorities 0 to 9) in arrival order.
    assert_eq!(order_of_service(answers).await, ["P10", "P0", "P5", "P9"]);
}

#[tokio::test]
async fn a_full_queue_gives_its_newest_low_priority_place_to_a_higher_priority_arrival() {
    let server = one_at_a_time(3, &[], &[]);
    let client = Client::new(&server);
    let running = client.hold().await;
    let mut answers = Vec::new();
    for (queued, label) in ["L1", "L2", "L3"].into_iter().enumerate() {
        answers.push(client.enqueue(label, &priority("0"), queued + 1).await);
    }
    let urgent = client.send("H", &priority("5"));

    // The newest priority-0 request is answered at once, while the engine
    // is still busy with the running one.
    let displaced = within(answers.pop().unwrap()).await.unwrap();
    assert_eq!(displaced.label, "L3");
    assert_eq!(displaced.status, 529, "{displaced:?}");
    assert_eq!(displaced.reason.as_deref(), Some("displaced"));
    let error = &displaced.body["error"];
    assert_eq!(error["type"], "overloaded");
    assert_eq!(error["reason"], "displaced");
    assert_eq!(error["scope"], "worker");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("higher priority"),
        "{error}"
    );
    client.wait_until_queued(3).await;

    // The arrival took its place, ahead of the older requests.
    drop(running);
    answers.insert(0, urgent);
    assert_eq!(order_of_service(answers).await, ["H", "L1", "L2"]);
}

#[tokio::test]
async fn malformed_priority_and_tenant_headers_are_served_as_plain_requests() {
    let server = one_at_a_time(8, &[], &[]);
    let client = Client::new(&server);
    let running = client.hold().await;
    let hostile: [&[(&str, &str)]; 5] = [
        &[("x-admission-priority", "high")],
        &[("x-admission-priority", "99999999999")],
        &[("x-admission-priority", "+5")],
        &[("x-admission-priority", "5"), ("x-admission-priority", "5")],
        &[("x-admission-tenant", "")],
    ];
    let mut answers = Vec::new();
    let labels = ["P1", "P2", "P3", "P4", "T1"];
    for (queued, (label, headers)) in labels.into_iter().zip(hostile).enumerate() {
        answers.push(client.enqueue(label, headers, queued + 1).await);
    }
    drop(running);
    // Priority 0, no tenant: first come, first served.
    assert_eq!(order_of_service(answers).await, labels);
}

#[tokio::test]
async fn the_qos_settings_come_from_flags_and_variables_and_show_in_the_banner() {
    let server = one_at_a_time(
        8,
        &["--priority-bands=-1,0,5", "--aging-interval-ms", "1500"],
        &[("DYN_BACKEND_ADMISSION_TENANT_WEIGHTS", "chat=4, batch=1")],
    );
    for expected in [
        "qos: priority from x-admission-priority, tenant from x-admission-tenant",
        "priority bands -1,0,5",
        "tenant weights batch=1,chat=4",
        "aging interval 1500 ms",
    ] {
        assert!(
            server.banner.contains(expected),
            "{expected}: {}",
            server.banner
        );
    }

    let plain = one_at_a_time(8, &[], &[]);
    assert!(
        plain
            .banner
            .contains("priority bands every priority; tenant weights all 1; aging interval off"),
        "{}",
        plain.banner
    );
}

#[test]
fn an_invalid_qos_flag_stops_the_server_naming_the_flag_and_the_value() {
    for (args, flag, value) in [
        (
            &["--tenant-weight", "chat=0"][..],
            "--tenant-weight",
            "'chat=0'",
        ),
        (
            &["--priority-bands", "0,5,0"][..],
            "--priority-bands",
            "'0,5,0'",
        ),
        (
            &["--aging-interval-ms", "0"][..],
            "--aging-interval-ms",
            "'0'",
        ),
    ] {
        let (status, _, stderr) = support::run("openai_server", args);
        assert!(!status.success(), "{args:?} started");
        assert!(
            stderr.contains(flag) && stderr.contains(value),
            "{args:?}: {stderr}"
        );
    }
}

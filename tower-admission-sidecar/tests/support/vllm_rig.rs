// The tests' rig against a real vLLM: vLLM and sidecar processes, SSE
// reads, metrics polls. Included whole (`include!`) by
// `tests/proxy_vllm.rs`, whose items and imports it shares, so that the
// test file stays short.

/// vLLM's `--max-num-seqs`, per rank, in every configuration here; the
/// sidecar is told the same (`--max-num-seqs 4`: vLLM reports it nowhere).
const SEQS: usize = 4;

/// Output tokens of a request that outlives any step of a test: the
/// context is 2,048 tokens, the prompt about 20, and the tiny model writes
/// 25-150 tokens a second a stream on this machine.
const LONG: usize = 1_900;

/// One test at a time: they share the engine, and two cores do not run an
/// engine's three processes, a sidecar and the clients of two tests without
/// each one's timings getting in the way of the other's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn chat(max_tokens: usize, stream: bool) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": "tiny",
        "stream": stream,
        "max_tokens": max_tokens,
        // vLLM's own sampling parameter: run to max_tokens (the model also
        // practically never writes its EOS token).
        "ignore_eos": true,
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
    });
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client.post(format!("{url}/v1/chat/completions")).json(body);
    for &(name, value) in headers {
        request = request.header(name, value);
    }
    within(request.send())
        .await
        .unwrap_or_else(|error| panic!("POST {url}/v1/chat/completions: {error}"))
}

/// An event stream read event by event.
struct Sse {
    stream: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    buffer: String,
    /// Longest wait for the next bytes.
    patience: Duration,
}

impl Sse {
    fn new(response: reqwest::Response) -> Sse {
        Sse {
            stream: Box::pin(response.bytes_stream()),
            buffer: String::new(),
            patience: PATIENCE,
        }
    }

    /// Waits up to `patience` for each next bytes: a stream queued in
    /// vLLM behind others is silent until it runs.
    fn patience(mut self, patience: Duration) -> Sse {
        self.patience = patience;
        self
    }

    /// The next event's `data`; `None` at the end of the stream.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                match event.trim().strip_prefix("data: ") {
                    Some(data) => return Some(data.to_owned()),
                    None => continue, // a comment or another field
                }
            }
            let next = tokio::time::timeout(self.patience, self.stream.next()).await;
            match next.unwrap_or_else(|_| panic!("no event within {:?}", self.patience)) {
                Some(Ok(bytes)) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                Some(Err(error)) => panic!("the stream broke: {error}"),
                None => return None,
            }
        }
    }

    /// Every remaining event.
    async fn rest(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// Whether an event is a chunk with generated text.
fn has_content(event: &str) -> bool {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(event) else {
        return false;
    };
    json["choices"][0]["delta"]["content"]
        .as_str()
        .is_some_and(|content| !content.is_empty())
}

fn is_error(event: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(event).is_ok_and(|json| json.get("error").is_some())
}

/// Sends a streamed chat and returns it once its head says `200`: the gate
/// admitted it and vLLM took it, though its first token may wait for one
/// of vLLM's sequences (with two ranks, vLLM's API servers may put a fifth
/// on one rank while the other has room: it waits there for a 1,900-token
/// stream to end, minutes on these cores; a clean CI run saw it).
async fn admitted_stream(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Sse {
    let response = post(client, url, &chat(LONG, true), headers).await;
    let status = response.status();
    assert_eq!(status, 200, "{:?}", within(response.text()).await);
    Sse::new(response).patience(PATIENCE)
}

/// How long a request sent to a busy vLLM may take to its first token.
const FIRST_TOKEN_PATIENCE: Duration = Duration::from_secs(60);

/// Sends a streamed chat and reads it until its first generated text:
/// the request is running in vLLM. Panics on any other answer.
async fn running_stream(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Sse {
    let response = post(client, url, &chat(LONG, true), headers).await;
    let status = response.status();
    assert_eq!(status, 200, "{:?}", within(response.text()).await);
    // A first token can wait long for a core: with two ranks, two busy
    // engine processes and the API server share the 2 cores (a clean CI
    // run saw a stream without an event for 20 s).
    let mut sse = Sse::new(response).patience(FIRST_TOKEN_PATIENCE);
    loop {
        match sse.next().await {
            Some(event) if has_content(&event) => return sse.patience(PATIENCE),
            Some(event) => assert!(!is_error(&event), "an error event: {event}"),
            None => panic!("the stream ended before any text"),
        }
    }
}

struct Sidecar {
    url: String,
    process: Process,
}

fn start_sidecar(engine: &str, args: &[&str]) -> Sidecar {
    let mut all = vec!["--listen", "127.0.0.1:0", "--upstream", engine];
    all.extend_from_slice(args);
    let process = Process::spawn(
        env!("CARGO_BIN_EXE_tower-admission").as_ref(),
        &all,
        &[("RUST_LOG", "info")],
    );
    let url = process.listening_url();
    Sidecar { url, process }
}

/// A shared engine and a sidecar of this test in front of it.
struct Rig {
    client: reqwest::Client,
    kit: vllm::Kit,
    engine: String,
    sidecar: Sidecar,
    /// When this test got its turn, and how long its engine took to start
    /// (zero when it was running already).
    began: Instant,
    engine_start: Duration,
    _one: tokio::sync::MutexGuard<'static, ()>,
}

/// The engine with `engine_flags` (after [`vllm::BASE_FLAGS`]) and a
/// sidecar with `sidecar_args`, once the engine is idle; `None` when the
/// test is skipped. `may_not_start`: a server vLLM cannot start here skips
/// the test with vLLM's error (unless `REQUIRE_VLLM=1`) instead of failing it.
async fn rig(engine_flags: &[&str], sidecar_args: &[&str], may_not_start: bool) -> Option<Rig> {
    let one = ONE_AT_A_TIME.lock().await;
    let began = Instant::now();
    let kit = vllm::kit()?;
    let engine = match vllm::engine(&kit, engine_flags).await {
        Ok(url) => url,
        Err(reason) if may_not_start => {
            vllm::skip(&reason);
            return None;
        }
        Err(reason) => panic!("{reason}"),
    };
    let engine_start = began.elapsed();
    let client = client();
    // An earlier test that failed may have left requests behind.
    eventually("vLLM is idle", PATIENCE, || async {
        let metrics = vllm::scrape(&client, &engine).await;
        metrics.running(None) == 0.0 && metrics.waiting(None) == 0.0
    })
    .await;
    let sidecar = start_sidecar(&engine, sidecar_args);
    Some(Rig {
        client,
        kit,
        engine,
        sidecar,
        began,
        engine_start,
        _one: one,
    })
}

impl Drop for Rig {
    fn drop(&mut self) {
        eprintln!(
            "{}: {:.1} s, of which {:.1} s starting vLLM",
            std::thread::current().name().unwrap_or("a test"),
            self.began.elapsed().as_secs_f64(),
            self.engine_start.as_secs_f64()
        );
        if std::thread::panicking() {
            eprintln!(
                "the sidecar's log:\n{}\nvLLM's log ends:\n{}",
                self.sidecar.process.stderr(),
                vllm::current_log()
            );
        }
    }
}

impl Rig {
    async fn vllm(&self) -> VllmMetrics {
        vllm::scrape(&self.client, &self.engine).await
    }

    async fn gate(&self) -> Exposition {
        within(exposition::scrape(&self.client, &self.sidecar.url)).await
    }

    /// Waits until neither the gate nor vLLM holds a request.
    async fn idle(&self) {
        eventually("the gate and vLLM are idle", PATIENCE, || async {
            let gate = self.gate().await;
            let vllm = self.vllm().await;
            gate_sum(&gate, "engine_request_count", None) == 0.0
                && gate_sum(&gate, "engine_request_waiting_count", None) == 0.0
                && gate_sum(&gate, "request_queue_count", None) == 0.0
                && vllm.running(None) == 0.0
                && vllm.waiting(None) == 0.0
        })
        .await;
    }
}

/// A gate series summed over its `dp_rank`s, or of one (`"unspecified"`:
/// the unranked requests).
fn gate_sum(metrics: &Exposition, suffix: &str, rank: Option<&str>) -> f64 {
    let name = format!("{}_{suffix}", tower_admission::metrics::DEFAULT_PREFIX);
    match rank {
        Some(rank) => metrics.sum(&name, &[("dp_rank", rank)]),
        None => metrics.sum(&name, &[]),
    }
}

/// Polls `condition` every 20 ms until it holds; fails after `patience`.
/// Returns how long it took.
async fn eventually<F, Fut>(what: &str, patience: Duration, mut condition: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(
            start.elapsed() < patience,
            "not within {patience:?}: {what}\nvLLM's log ends:\n{}",
            vllm::current_log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// One read of vLLM's gauges during a burst, and when it was sent.
#[derive(Clone, Copy, Debug)]
struct Poll {
    sent: Instant,
    running: f64,
    waiting: f64,
}

/// Reads vLLM's `/metrics` every 50 ms, each read sent on time even while
/// an earlier one is still being answered (under load vLLM's API server can
/// take a while to render it), until [`Poller::stop`]. On a thread and a
/// runtime of its own, so that the test's clients do not delay it.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Poll>>>,
}

/// A test that fails mid-burst stops its reader too.
impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Poller {
    fn start(engine: &str) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let (engine, stopped) = (engine.to_owned(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            raise_priority_of_this_thread();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = client();
                let mut every = tokio::time::interval(Duration::from_millis(50));
                let mut reads = Vec::new();
                while !stopped.load(Ordering::SeqCst) {
                    every.tick().await;
                    let (client, engine) = (client.clone(), engine.clone());
                    // Only the reading here: parsing waits until the end, so
                    // that no read is held back by the parsing of another.
                    reads.push(tokio::spawn(async move {
                        let sent = Instant::now();
                        (sent, vllm::scrape_text(&client, &engine).await)
                    }));
                }
                let mut polls = Vec::new();
                for read in reads {
                    let (sent, text) = read.await.unwrap();
                    let metrics = VllmMetrics::parse(&text);
                    polls.push(Poll {
                        sent,
                        running: metrics.running(None),
                        waiting: metrics.waiting(None),
                    });
                }
                polls
            })
        });
        Poller {
            stop,
            thread: Some(thread),
        }
    }

    async fn stop(mut self) -> Vec<Poll> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().unwrap();
        within(tokio::task::spawn_blocking(move || thread.join().unwrap()))
            .await
            .unwrap()
    }
}

/// Asks Linux (where nice values are per thread) to run this thread ahead
/// of ordinary processes, as root may: on two cores shared with vLLM's three
/// busy processes, the sidecar and sixteen clients, a reader at the default
/// priority can miss its 50 ms tick by hundreds of milliseconds. Best
/// effort: without the privilege the reads keep the default priority.
fn raise_priority_of_this_thread() {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else {
        return;
    };
    if let Some(tid) = link.file_name().and_then(|tid| tid.to_str()) {
        let _ = std::process::Command::new("renice")
            .args(["-n", "-10", "-p", tid])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The reads more than 100 ms after the one before: (ms since the first
/// read, the gap in ms).
fn late_reads(polls: &[Poll]) -> Vec<(u128, u128)> {
    let Some(first) = polls.first() else {
        return Vec::new();
    };
    polls
        .windows(2)
        .filter(|pair| pair[1].sent - pair[0].sent > Duration::from_millis(100))
        .map(|pair| {
            (
                (pair[1].sent - first.sent).as_millis(),
                (pair[1].sent - pair[0].sent).as_millis(),
            )
        })
        .collect()
}

/// Longest a burst may take to be answered whole.
const BURST: Duration = Duration::from_secs(180);

/// What a client of a burst saw.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// When the response head arrived.
    answered: Instant,
    /// The events of a stream, or the body of another answer.
    events: Vec<String>,
    ended: Instant,
}

/// Sends `n` streamed chats of `tokens` tokens to `url` at once, reading
/// vLLM's gauges all along; returns the answers and the reads.
async fn burst(
    client: &reqwest::Client,
    url: &str,
    engine: &str,
    n: usize,
    tokens: usize,
) -> (Vec<Answer>, Vec<Poll>) {
    let poller = Poller::start(engine);
    let sent: Vec<_> = (0..n)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                // A request queued in the sidecar has no response head until
                // it runs: the burst's patience, not an event's.
                let request = client
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&chat(tokens, true))
                    .send();
                let response = tokio::time::timeout(BURST, request)
                    .await
                    .unwrap_or_else(|_| panic!("no response head within {BURST:?}"))
                    .unwrap();
                let status = response.status().as_u16();
                let answered = Instant::now();
                let events = if status == 200 {
                    Sse::new(response).patience(BURST).rest().await
                } else {
                    vec![within(response.text()).await.unwrap()]
                };
                Answer {
                    status,
                    answered,
                    events,
                    ended: Instant::now(),
                }
            })
        })
        .collect();
    // The whole burst: a few seconds on a quiet machine, many more while
    // other builds load its two cores (each event has PATIENCE).
    let mut answers = Vec::new();
    for handle in sent {
        let answer = tokio::time::timeout(BURST, handle)
            .await
            .unwrap_or_else(|_| panic!("the burst took over {BURST:?}"));
        answers.push(answer.unwrap());
    }
    (answers, poller.stop().await)
}

/// Checks a stream that ran to its end: `[DONE]` last, finish_reason
/// "length", `tokens` completion tokens in its usage chunk.
fn assert_whole(events: &[String], tokens: usize) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    assert!(!events.iter().any(|event| is_error(event)), "{events:?}");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .any(|chunk| chunk["choices"][0]["finish_reason"] == "length"),
        "no finish_reason length"
    );
    let usage = chunks.last().unwrap()["usage"]["completion_tokens"].as_u64();
    assert_eq!(usage, Some(tokens as u64), "every token of the answer");
}

/// The reads more than 100 ms after the one before must be few: nine in
/// ten reads at most 100 ms after the one before. (Every one, on a quiet
/// machine; with other builds loading its two cores, a read now and then
/// comes hundreds of milliseconds late whatever its priority, which says
/// nothing of the sidecar. `vllm:request_queue_time_seconds` is vLLM's
/// complete record, checked beside the reads.)
#[track_caller]
fn assert_on_schedule(polls: &[Poll]) {
    let late = late_reads(polls);
    assert!(polls.len() >= 10, "{} reads", polls.len());
    assert!(
        late.len() * 10 <= polls.len(),
        "{} of {} reads came over 100 ms after the one before (at ms, by ms): {late:?}",
        late.len(),
        polls.len()
    );
}

/// vLLM's record of every request's time in its own waiting queue
/// (`vllm:request_queue_time_seconds`, buckets from 0.3 s): (requests,
/// requests that waited 0.3 s at most).
fn queue_times(metrics: &VllmMetrics) -> (f64, f64) {
    (
        metrics.sum("vllm:request_queue_time_seconds_count", &[]),
        metrics.sum("vllm:request_queue_time_seconds_bucket", &[("le", "0.3")]),
    )
}

/// The sidecar's flags in front of one rank: vLLM's max_num_seqs and a
/// queue of four.
const SIDECAR_ONE_RANK: [&str; 4] = ["--max-num-seqs", "4", "--request-queue-limit", "4"];

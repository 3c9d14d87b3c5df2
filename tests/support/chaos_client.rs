//! The chaos soak's clients and the engine's capacity reports: pooled
//! HTTP/1.1 and HTTP/2 clients that go away at the plan's point, and a task
//! that moves the capacities meanwhile.

use super::*;

// ---- the clients ----

/// How requests ended, seen by the clients.
#[derive(Debug, Default, Clone)]
pub struct ClientFigures {
    pub requests: u64,
    pub http2: u64,
    pub completed: u64,
    pub overloaded: u64,
    pub server_errors: u64,
    /// Connection failures the client did not cause (a panic or a failed
    /// body on the server cut the stream).
    pub cut_by_server: u64,
    pub gave_up_waiting: u64,
    pub dropped_after_head: u64,
    pub dropped_mid_stream: u64,
    pub half_heads: u64,
    pub half_bodies: u64,
}

impl ClientFigures {
    pub fn add(&mut self, other: &ClientFigures) {
        self.requests += other.requests;
        self.http2 += other.http2;
        self.completed += other.completed;
        self.overloaded += other.overloaded;
        self.server_errors += other.server_errors;
        self.cut_by_server += other.cut_by_server;
        self.gave_up_waiting += other.gave_up_waiting;
        self.dropped_after_head += other.dropped_after_head;
        self.dropped_mid_stream += other.dropped_mid_stream;
        self.half_heads += other.half_heads;
        self.half_bodies += other.half_bodies;
    }

    pub fn disconnects(&self) -> u64 {
        self.gave_up_waiting
            + self.dropped_after_head
            + self.dropped_mid_stream
            + self.half_heads
            + self.half_bodies
    }
}

/// The clients of one run, sharing pooled connections.
#[derive(Clone)]
pub struct Clients {
    pub http1: reqwest::Client,
    pub http2: PooledClient<HttpConnector, Full<Bytes>>,
}

impl Clients {
    pub fn new() -> Clients {
        Clients {
            http1: reqwest::Client::builder()
                .pool_max_idle_per_host(CONCURRENCY)
                .build()
                .unwrap(),
            http2: PooledClient::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        }
    }

    /// Sends `plan`'s request; resolves at its response head.
    pub async fn send(&self, addr: SocketAddr, plan: &Plan) -> Result<Streamed, ()> {
        const BODY: &str = r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let url = format!("http://{addr}{ROUTE}");
        if plan.http2 {
            let mut request = http::Request::post(url).header("x-chaos", plan.header());
            for rank in &plan.ranks {
                request = request.header("x-data-parallel-rank", rank);
            }
            let request = request.body(Full::new(Bytes::from_static(BODY.as_bytes())));
            let response = self.http2.request(request.unwrap()).await.map_err(drop)?;
            return Ok(Streamed::Http2(response));
        }
        let mut request = self
            .http1
            .post(url)
            .header("x-chaos", plan.header())
            .body(BODY);
        for rank in &plan.ranks {
            request = request.header("x-data-parallel-rank", rank);
        }
        let response = request.send().await.map_err(drop)?;
        Ok(Streamed::Http1(response))
    }
}

/// A response being read, over either protocol. Dropping it before its end
/// closes the HTTP/1.1 connection or resets the HTTP/2 stream.
pub enum Streamed {
    Http1(reqwest::Response),
    Http2(http::Response<hyper::body::Incoming>),
}

impl Streamed {
    pub fn status(&self) -> u16 {
        match self {
            Streamed::Http1(response) => response.status().as_u16(),
            Streamed::Http2(response) => response.status().as_u16(),
        }
    }

    /// The next chunk of data; `Err` if the server cut the stream.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ()> {
        match self {
            Streamed::Http1(response) => response.chunk().await.map_err(drop),
            Streamed::Http2(response) => loop {
                match response.body_mut().frame().await {
                    None => return Ok(None),
                    Some(Err(_)) => return Err(()),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            return Ok(Some(data));
                        }
                    }
                }
            },
        }
    }

    /// Reads to the end; the data, or `Err` if the server cut the stream.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, ()> {
        let mut all = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }
}

pub fn raw_head(plan: &Plan, body_len: usize) -> Vec<u8> {
    let mut head = format!(
        "POST {ROUTE} HTTP/1.1\r\nhost: worker\r\ncontent-type: application/json\r\ncontent-length: {body_len}\r\nx-chaos: {}\r\n",
        plan.header()
    );
    for rank in &plan.ranks {
        head.push_str(&format!("x-data-parallel-rank: {rank}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

pub async fn one_request(clients: &Clients, addr: SocketAddr, plan: &Plan) -> ClientFigures {
    let mut figures = ClientFigures {
        requests: 1,
        ..ClientFigures::default()
    };
    match plan.act {
        ClientAct::HalfHead => {
            let head = raw_head(plan, 0);
            let mut socket = TcpStream::connect(addr).await.unwrap();
            let _ = socket.write_all(&head[..head.len() / 2]).await;
            figures.half_heads += 1;
            return figures;
        }
        ClientAct::HalfBody => {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            let _ = socket.write_all(&raw_head(plan, 64)).await;
            let _ = socket.write_all(b"{\"messages\":[").await;
            tokio::task::yield_now().await;
            figures.half_bodies += 1;
            return figures;
        }
        _ => {}
    }

    if plan.http2 {
        figures.http2 += 1;
    }
    let sent = clients.send(addr, plan);
    let response = match plan.act {
        ClientAct::GiveUpWaiting { ms } => match timeout(Duration::from_millis(ms), sent).await {
            Ok(response) => response,
            Err(_) => {
                figures.gave_up_waiting += 1;
                return figures;
            }
        },
        _ => sent.await,
    };
    let Ok(mut response) = response else {
        figures.cut_by_server += 1;
        return figures;
    };
    match response.status() {
        529 => {
            figures.overloaded += 1;
            let body = response.read_to_end().await.unwrap_or_default();
            let body = String::from_utf8_lossy(&body);
            assert!(
                body.contains("overloaded"),
                "a 529 without its JSON: {body}"
            );
            return figures;
        }
        500 => {
            figures.server_errors += 1;
            let _ = response.read_to_end().await;
            return figures;
        }
        200 => {}
        status => panic!("unexpected status {status} for {plan:?}"),
    }
    match plan.act {
        ClientAct::DropAfterHead | ClientAct::GiveUpWaiting { .. } => {
            figures.dropped_after_head += 1;
        }
        ClientAct::DropMidStream { chunks } => {
            for _ in 0..chunks {
                match response.chunk().await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        figures.completed += 1;
                        return figures;
                    }
                    Err(_) => {
                        figures.cut_by_server += 1;
                        return figures;
                    }
                }
            }
            figures.dropped_mid_stream += 1;
        }
        ClientAct::ReadAll => match response.read_to_end().await {
            Ok(_) => figures.completed += 1,
            Err(()) => figures.cut_by_server += 1,
        },
        ClientAct::HalfHead | ClientAct::HalfBody => unreachable!("answered above"),
    }
    figures
}

/// Sends requests `next..requests` (shared with the other clients) one at a
/// time; each is bounded by `REQUEST_LIVENESS`.
pub async fn client_task(
    clients: Clients,
    addr: SocketAddr,
    seed: u64,
    next: Arc<AtomicUsize>,
    requests: usize,
) -> ClientFigures {
    let mut figures = ClientFigures::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        if index >= requests {
            return figures;
        }
        let plan = Plan::new(seed, index);
        let done = timeout(REQUEST_LIVENESS, one_request(&clients, addr, &plan))
            .await
            .unwrap_or_else(|_| {
                panic!("request {index} ({plan:?}) stuck for {REQUEST_LIVENESS:?}")
            });
        figures.add(&done);
    }
}

// ---- the engine's capacity reports ----

#[derive(Debug, Default)]
pub struct ReporterFigures {
    pub reports: u64,
    pub most_in_engine: usize,
    pub most_queued: usize,
}

/// Reports a new capacity every 2 ms until told to stop, and samples the
/// gate's peak occupancy.
pub async fn report_capacities(
    gate: Gate,
    seed: u64,
    mut stop: oneshot::Receiver<()>,
) -> ReporterFigures {
    let mut rng = Rng::new(seed ^ 0xC0FF_EE00);
    let mut figures = ReporterFigures::default();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    loop {
        tokio::select! {
            _ = &mut stop => return figures,
            _ = tick.tick() => {}
        }
        let max_num_seqs = 4 + rng.below(21) as usize;
        let ranks = 1 + rng.below(4) as usize;
        gate.report_capacity(EngineCapacity::new(max_num_seqs, ranks));
        figures.reports += 1;
        let total = gate.snapshot().total;
        figures.most_in_engine = figures.most_in_engine.max(total.engine_requests);
        figures.most_queued = figures.most_queued.max(total.queued);
    }
}

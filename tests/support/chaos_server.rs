//! The chaos soak's server: an axum worker behind the admission layer over
//! loopback TCP, whose handler misbehaves as each request's plan says, and
//! which counts its open connections and HTTP/2 stream tasks.

use super::*;

// ---- the server ----

/// What the server did, counted where it happened.
#[derive(Default)]
pub struct ServerEvents {
    pub handled: AtomicU64,
    pub panics_in_handler: AtomicU64,
    pub panics_mid_stream: AtomicU64,
    pub server_errors: AtomicU64,
    pub body_errors: AtomicU64,
    pub empty_bodies: AtomicU64,
    pub trailers: AtomicU64,
    pub streams_finished: AtomicU64,
}

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Waits `ms` milliseconds of the engine's work; 0 only yields.
pub async fn work(ms: u64) {
    if ms == 0 {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

pub struct StreamState {
    pub step: u32,
    pub tokens: u32,
    pub handler: Answer,
    /// The step at which a failing stream fails.
    pub fail_at: u32,
    pub rng: Rng,
    pub events: Arc<ServerEvents>,
}

pub type ChunkResult = Result<Frame<Bytes>, std::io::Error>;

/// The next frame of a streamed answer.
pub async fn next_frame(mut state: StreamState) -> Option<(ChunkResult, StreamState)> {
    let step = state.step;
    state.step += 1;
    let failing = matches!(state.handler, Answer::BodyError | Answer::PanicMidStream);
    if failing && step == state.fail_at {
        work(state.rng.below(2)).await;
        if state.handler == Answer::PanicMidStream {
            bump(&state.events.panics_mid_stream);
            panic!("{INJECTED} mid-stream");
        }
        bump(&state.events.body_errors);
        return Some((
            Err(std::io::Error::other("engine failed mid-stream")),
            state,
        ));
    }
    let frame = match step {
        0 => Frame::data(Bytes::from_static(ROLE_CHUNK)),
        1 => {
            let first_token_ms = if state.handler == Answer::SlowFirstToken {
                5 + state.rng.below(15)
            } else {
                state.rng.below(3)
            };
            work(first_token_ms).await;
            Frame::data(Bytes::from_static(TOKEN_CHUNK))
        }
        step if step <= state.tokens => {
            work(state.rng.below(3)).await;
            Frame::data(Bytes::from_static(TOKEN_CHUNK))
        }
        step if step == state.tokens + 1 => Frame::data(Bytes::from_static(DONE_CHUNK)),
        step if step == state.tokens + 2 && state.handler == Answer::Trailers => {
            bump(&state.events.trailers);
            let mut trailers = HeaderMap::new();
            trailers.insert("x-finish-reason", "stop".parse().unwrap());
            Frame::trailers(trailers)
        }
        _ => {
            bump(&state.events.streams_finished);
            return None;
        }
    };
    Some((Ok(frame), state))
}

pub async fn generate(State(events): State<Arc<ServerEvents>>, headers: HeaderMap) -> Response {
    bump(&events.handled);
    let plan = headers
        .get("x-chaos")
        .and_then(|value| value.to_str().ok())
        .map(|value| value.split(' ').map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default();
    let field = |index: usize| plan.get(index).and_then(|value| value.parse::<u64>().ok());
    let handler = HANDLERS[field(0).unwrap_or(0) as usize % HANDLERS.len()].0;
    let tokens = field(1).unwrap_or(4) as u32;
    let mut rng = Rng::new(field(2).unwrap_or(0));

    // Time to the response head.
    work(rng.below(3)).await;
    match handler {
        Answer::ServerError => {
            bump(&events.server_errors);
            return (StatusCode::INTERNAL_SERVER_ERROR, "engine failed").into_response();
        }
        Answer::PanicInHandler => {
            bump(&events.panics_in_handler);
            panic!("{INJECTED} in the handler");
        }
        Answer::EmptyBody => {
            bump(&events.empty_bodies);
            return StatusCode::OK.into_response();
        }
        _ => {}
    }
    let fail_at = 1 + rng.below(u64::from(tokens)) as u32;
    let state = StreamState {
        step: 0,
        tokens,
        handler,
        fail_at,
        rng,
        events,
    };
    let body = http_body_util::StreamBody::new(futures::stream::unfold(state, next_frame));
    let mut response = AxumBody::new(body).into_response();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "text/event-stream".parse().unwrap(),
    );
    response
}

/// Counts a connection, or an HTTP/2 stream's task, from its start to its
/// end (normal, error or panic).
pub struct OpenTask(Arc<watch::Sender<usize>>);

impl OpenTask {
    pub fn new(open: &Arc<watch::Sender<usize>>) -> OpenTask {
        open.send_modify(|open| *open += 1);
        OpenTask(open.clone())
    }
}

impl Drop for OpenTask {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

/// Spawns hyper's HTTP/2 stream tasks on tokio, counted.
#[derive(Clone)]
pub struct CountedExecutor(Arc<watch::Sender<usize>>);

impl<F> hyper::rt::Executor<F> for CountedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let task = OpenTask::new(&self.0);
        tokio::spawn(async move {
            let _task = task;
            future.await;
        });
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub open: watch::Receiver<usize>,
    pub events: Arc<ServerEvents>,
}

/// Serves the worker: `ROUTE` behind the admission layer, `/health` beside
/// it; one task per connection (HTTP/1.1, or HTTP/2 with prior knowledge)
/// and one per HTTP/2 stream, as `axum::serve` does, but counted.
pub async fn serve(gate: &Gate) -> Server {
    let events = Arc::new(ServerEvents::default());
    let app = Router::new()
        .route(ROUTE, post(generate))
        .layer(
            AdmissionLayer::new(gate.clone())
                .detector(OpenAiSse::default())
                .rank(RankHeader::default()),
        )
        .route("/health", get(|| async { "ok" }))
        .with_state(events.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (open_tx, open) = watch::channel(0usize);
    let open_tx = Arc::new(open_tx);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue; // e.g. a connection reset before it was accepted
            };
            let connection = OpenTask::new(&open_tx);
            let service = TowerToHyperService::new(app.clone());
            let executor = CountedExecutor(open_tx.clone());
            tokio::spawn(async move {
                let _connection = connection;
                let _ = auto::Builder::new(executor)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Server { addr, open, events }
}

impl Server {
    /// Waits until every connection made so far has been accepted and has
    /// ended, with its HTTP/2 stream tasks: then no response future or body
    /// of the run is left.
    pub async fn drained(&mut self) {
        // A connection accepted after every earlier one: the listener's
        // backlog holds nothing older.
        let mut sentinel = TcpStream::connect(self.addr).await.unwrap();
        sentinel
            .write_all(b"GET /health HTTP/1.1\r\nhost: worker\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        timeout(DRAIN_LIVENESS, sentinel.read_to_end(&mut answer))
            .await
            .expect("the server does not answer")
            .unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        drop(sentinel);
        let drained = timeout(DRAIN_LIVENESS, self.open.wait_for(|&open| open == 0))
            .await
            .map(|open| open.map(|_| ()));
        match drained {
            Ok(result) => result.expect("the server's count of connections is gone"),
            Err(_) => panic!(
                "{} connections or stream tasks still open {DRAIN_LIVENESS:?} after the clients left",
                *self.open.borrow()
            ),
        }
    }
}

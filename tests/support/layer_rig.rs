// The admission layer's test rig: a gate, a mock inner service, requests,
// bodies and their frames. Included whole (`include!`) by `tests/http_layer.rs`
// and `tests/http_layer_bodies.rs`, whose imports it shares.

type Service = mock::Spawn<Admission<mock::Mock<Request<()>, Response<Body>>>>;
type Handle = mock::Handle<Request<()>, Response<Body>>;
type Respond = mock::SendResponse<Response<Body>>;
type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// A response body whose frames the test sends one by one; closing the
/// sender ends it.
fn streaming_body() -> (Frames, Body) {
    let (frames, rx) = mpsc::unbounded_channel();
    (
        frames,
        StreamBody::new(UnboundedReceiverStream::new(rx)).boxed_unsync(),
    )
}

fn empty_body() -> Body {
    Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn data(bytes: &'static str) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from_static(bytes.as_bytes())))
}

/// One rank: `engine` requests at once, all of them may wait, `queue` more queued.
fn gate(engine: usize, queue: usize) -> Gate {
    gate_support::gate(engine, engine, queue)
}

fn request(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

fn service(gate: &Gate) -> (Service, Handle) {
    let (inner, handle) = mock::pair();
    (
        mock::Spawn::new(AdmissionLayer::new(gate.clone()).layer(inner)),
        handle,
    )
}

/// A called request's response future, polled once as soon as it was made,
/// the way a server polls it: an admitted request reaches the inner service
/// on that first poll.
struct Call<F: std::future::Future> {
    task: task::Spawn<F>,
    /// What the first poll returned, if it was ready.
    early: Option<F::Output>,
}

impl<F: std::future::Future> Call<F> {
    fn poll(&mut self) -> Poll<F::Output> {
        match self.early.take() {
            Some(output) => Poll::Ready(output),
            None => self.task.poll(),
        }
    }

    fn is_woken(&self) -> bool {
        self.task.is_woken()
    }
}

/// Calls `service` with `req` after driving it to readiness, and polls the
/// response future once.
fn call<S, B>(service: &mut mock::Spawn<S>, req: Request<B>) -> Call<S::Future>
where
    S: tower::Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    assert_ready_ok!(service.poll_ready());
    let mut task = task::spawn(service.call(req));
    let early = match task.poll() {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    };
    Call { task, early }
}

/// The next request the inner service received, with the means to answer it.
fn next_request(handle: &mut Handle) -> (Request<()>, Respond) {
    match handle.poll_request() {
        Poll::Ready(Some(request)) => request,
        _ => panic!("the inner service received no request"),
    }
}

fn no_request(handle: &mut Handle) {
    assert!(
        handle.poll_request().is_pending(),
        "the inner service received a request"
    );
}

/// Polls the next frame of `body`.
fn poll_frame<D: FirstTokenDetector + Unpin>(body: &mut ResponseBody<Body, D>) -> Polled {
    task::spawn(()).enter(|cx, _| Pin::new(&mut *body).poll_frame(cx))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|value| value.to_str().unwrap())
}

async fn body_json(body: ResponseBody<Body>) -> serde_json::Value {
    let bytes = body.collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn ranked_gate() -> Gate {
    Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .engine_request_waiting_limit(1)
            .request_queue_limit(0)
            .capacity(EngineCapacity::new(1, 2)),
    )
}

fn ranked(path: &str, rank: &str) -> Request<()> {
    Request::builder()
        .uri(path)
        .header("x-data-parallel-rank", rank)
        .body(())
        .unwrap()
}

/// A rank decided by a router in front of the layer, handed on as a
/// request extension of its own.
#[derive(Clone, Copy)]
struct DataParallelRank(u32);

/// An admitted request whose inner service answered with a body the test
/// controls.
async fn streaming_response(gate: &Gate) -> (Frames, ResponseBody<Body>) {
    let (mut service, mut handle) = service(gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/"));
    let (_, respond) = next_request(&mut handle);
    let (frames, body) = streaming_body();
    respond.send_response(Response::new(body));
    (frames, assert_ready_ok!(future.poll()).into_body())
}

/// Answers with a body of a fixed kind, to see how its end is recognised.
async fn respond_with(gate: &Gate, body: Body) -> ResponseBody<Body> {
    let (mut service, mut handle) = service(gate);
    handle.allow(1);
    let mut future = call(&mut service, request("/"));
    let (_, respond) = next_request(&mut handle);
    respond.send_response(Response::new(body));
    assert_ready_ok!(future.poll()).into_body()
}

/// A request to `service` answered by an SSE body the test controls.
async fn sse_response<S>(
    service: &mut mock::Spawn<S>,
    handle: &mut Handle,
) -> (Frames, S::Response, FirstToken)
where
    S: tower::Service<Request<()>>,
    S::Error: std::fmt::Debug,
{
    let mut future = call(service, request("/v1/chat/completions"));
    let (req, respond) = next_request(handle);
    let first_token = req.extensions().get::<FirstToken>().unwrap().clone();
    let (frames, body) = streaming_body();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    respond.send_response(response);
    (frames, assert_ready_ok!(future.poll()), first_token)
}

fn with_headers(path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut req = request(path);
    for (name, value) in headers {
        req.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    req
}

/// Calls `layer` around an inner service that records the path of each
/// request it receives (and answers it with an empty body), with one
/// request already running: each request is decided (queued) as it is
/// called, in order. The running request then ends, and the queue drains
/// one request at a time. Returns the paths in the order they reached the
/// inner service, and each request's status.
async fn served<L>(gate: &Gate, layer: L, requests: Vec<Request<()>>) -> (Vec<String>, Vec<u16>)
where
    L: Layer<tower::util::BoxCloneService<Request<()>, Response<Body>, Infallible>>,
    L::Service:
        tower::Service<Request<()>, Response = Response<ResponseBody<Body>>, Error = Infallible>,
{
    use futures::FutureExt as _;
    use tower::Service as _;
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = reached.clone();
    let inner = tower::util::BoxCloneService::new(tower::service_fn(move |req: Request<()>| {
        record.lock().unwrap().push(req.uri().path().to_owned());
        std::future::ready(Ok::<_, Infallible>(Response::new(empty_body())))
    }));
    let mut service = layer.layer(inner);
    let running = gate.acquire(None).now_or_never().unwrap().unwrap();
    let mut answers = Vec::new();
    for req in requests {
        tower::ServiceExt::ready(&mut service).await.unwrap();
        let response = service.call(req);
        answers.push(async move {
            let response = response.await.unwrap();
            let status = response.status().as_u16();
            let _ = response.into_body().collect().await.unwrap();
            status
        });
    }
    drop(running);
    let statuses = futures::future::join_all(answers).await;
    let reached = reached.lock().unwrap().clone();
    (reached, statuses)
}

//! The sidecar's proxy (`tower_admission_sidecar`) over real sockets: a
//! client (reqwest) → the sidecar → an engine that is a real HTTP server
//! written here (axum), whose every answer the test steps by hand. What
//! depends on a real inference engine is in `tests/llama_cpp.rs`.
//! The binary itself (flags, capacity, drain) is in `proxy_binary.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tower_admission::{AdmissionConfig, Counts, EngineCapacity, Gate, RejectionScope};
use tower_admission_route::OverloadAnswer;
use tower_admission_sidecar::{
    self as proxy, DiscoveryTiming, ORIGIN, Sidecar, Upstream, UpstreamOptions, UpstreamUrl,
};

mod support;
use support::*;

// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_burst_gets_the_engine_slot_one_queue_place_and_a_529_while_the_engine_sees_one() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();

    let first = within(chat(&client, &sidecar.url)).await;
    assert_eq!(first.status(), 200);
    let running = within(engine.arrivals.recv()).await.unwrap();

    // The second waits in the sidecar: the engine never hears of it.
    let second = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("the second request is queued", || {
        totals(&sidecar.gate).queued == 1
    })
    .await;
    assert!(engine.arrivals.try_recv().is_err());

    // The third finds the queue full: an overload answer at once.
    let third = within(chat(&client, &sidecar.url)).await;
    assert_eq!(third.status(), 529);
    let answer = OverloadAnswer::from_head(third.status(), third.headers()).unwrap();
    assert_eq!(answer.scope, RejectionScope::Worker);
    assert!(!third.headers().contains_key(ORIGIN));
    let json: serde_json::Value = third.json().await.unwrap();
    assert_eq!(json["error"]["type"], "overloaded");

    // The first streams to its end through the sidecar: the slot frees and
    // the queued request reaches the engine.
    let mut stream = first.bytes_stream();
    running
        .stream
        .send(Bytes::from_static(ROLE.as_bytes()))
        .unwrap();
    assert_eq!(
        within(stream.next()).await.unwrap().unwrap(),
        ROLE.as_bytes()
    );
    assert_eq!(
        totals(&sidecar.gate).engine_waiting,
        1,
        "a role chunk is not a token"
    );
    running
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    assert_eq!(
        within(stream.next()).await.unwrap().unwrap(),
        TOKEN.as_bytes()
    );
    until("the first token ends waiting", || {
        totals(&sidecar.gate).engine_waiting == 0
    })
    .await;
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    let mut rest = Vec::new();
    while let Some(chunk) = within(stream.next()).await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(rest, DONE.as_bytes());

    let next = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(
        next.body,
        chat_body(),
        "the body reaches the engine as sent"
    );
    drop(next.stream);
    let second = within(second).await.unwrap();
    assert_eq!(second.status(), 200);
    assert!(within(second.bytes()).await.unwrap().is_empty());
    until("everything released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    let tally = sidecar.gate.snapshot().tally;
    assert_eq!(
        (
            tally.admitted_direct,
            tally.admitted_queue,
            tally.rejected_worker
        ),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn other_routes_pass_straight_through_even_when_the_gate_is_full() {
    let mut engine = engine(1).await;
    let gate = Gate::new(
        AdmissionConfig::new()
            .capacity(EngineCapacity::new(1, 1))
            .request_queue_limit(0),
    );
    let sidecar = sidecar(gate, &engine.url, options(), |b| b).await;
    let client = client();
    let held = within(chat(&client, &sidecar.url)).await;
    let _running = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(within(chat(&client, &sidecar.url)).await.status(), 529);

    let models = within(client.get(format!("{}/v1/models", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(
        models.text().await.unwrap(),
        r#"{"object":"list","data":[]}"#
    );
    // A GET to a generation path is not a generation: the engine answers.
    let get = within(
        client
            .get(format!("{}/v1/chat/completions", sidecar.url))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(get.status(), 405);
    assert_eq!(get.headers()[ORIGIN], "engine");
    assert_eq!(totals(&sidecar.gate).engine_requests, 1);
    drop(held);
}

#[tokio::test]
async fn client_headers_that_steer_the_gate_are_removed_unless_a_router_is_trusted() {
    for trusted in [false, true] {
        let mut engine = engine(1).await;
        let gate = Gate::new(AdmissionConfig::new().capacity(EngineCapacity::new(2, 2)));
        let sidecar = sidecar(gate, &engine.url, options(), |b| {
            b.trust_router_headers(trusted)
        })
        .await;
        let response = within(
            client()
                .post(format!("{}/v1/chat/completions", sidecar.url))
                .header("x-data-parallel-rank", "1")
                .header("x-admission-priority", "100")
                .header("x-admission-tenant", "someone-else")
                .header("x-admission-deadline-ms", "5000")
                .header("authorization", "Bearer k")
                .header("connection", "x-secret-hop")
                .header("x-secret-hop", "1")
                .body(chat_body())
                .send(),
        )
        .await
        .unwrap();
        let arrival = within(engine.arrivals.recv()).await.unwrap();
        let seen = &arrival.headers;
        assert_eq!(seen["authorization"], "Bearer k");
        assert!(
            !seen.contains_key("x-secret-hop"),
            "hop-by-hop header forwarded"
        );
        assert_eq!(
            seen["host"],
            engine.url.strip_prefix("http://").unwrap(),
            "host is the engine's"
        );
        for steering in [
            "x-data-parallel-rank",
            "x-admission-priority",
            "x-admission-tenant",
            "x-admission-deadline-ms",
        ] {
            assert_eq!(
                seen.contains_key(steering),
                trusted,
                "{steering}, trusted {trusted}"
            );
        }
        // The rank header steered the gate only when trusted.
        let snapshot = sidecar.gate.snapshot();
        let ranked = snapshot.ranks[1].engine_requests;
        assert_eq!(ranked, usize::from(trusted), "trusted {trusted}");
        assert_eq!(snapshot.unranked.engine_requests, usize::from(!trusted));
        // The engine's hop-by-hop response header stays on its hop.
        assert!(!response.headers().contains_key("x-engine-hop"));
        drop(arrival.stream);
        within(response.bytes()).await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_engine_is_a_502_that_releases_its_capacity() {
    // A port nobody listens on: bound, then closed.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let sidecar = sidecar(small_gate(), &closed, options(), |b| b).await;
    let response = within(chat(&client(), &sidecar.url)).await;
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()[ORIGIN], "proxy");
    assert_eq!(response.headers()["content-type"], "application/json");
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], 502);
    assert_eq!(json["error"]["type"], "upstream_unreachable");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{json}"
    );
    until("the capacity is released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    // Not a gate overload: a frontend must not read it as one.
    let tally = sidecar.gate.snapshot().tally;
    assert_eq!((tally.rejected_rank, tally.rejected_worker), (0, 0));
}

#[tokio::test]
async fn an_engine_that_sends_no_head_in_time_is_a_504() {
    let engine = engine(1).await;
    let options = UpstreamOptions {
        response_timeout: Some(Duration::from_millis(200)),
        ..UpstreamOptions::default()
    };
    let sidecar = sidecar(small_gate(), &engine.url, options, |b| {
        b.admit_paths(["/slow"])
    })
    .await;
    let response = within(client().post(format!("{}/slow", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    assert_eq!(response.headers()[ORIGIN], "proxy");
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["type"], "upstream_timeout");
    until("the capacity is released", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
}

#[tokio::test]
async fn the_engine_s_own_overload_passes_through_marked_as_the_engine_s() {
    let engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
        b.admit_paths(["/busy"])
    })
    .await;
    let response = within(client().post(format!("{}/busy", sidecar.url)).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()[ORIGIN], "engine");
    assert_eq!(response.headers()["retry-after"], "3");
    assert!(
        !response
            .headers()
            .contains_key("x-admission-rejection-scope")
    );
    let answer = OverloadAnswer::from_head(response.status(), response.headers()).unwrap();
    assert!(!answer.from_gate, "the engine's 503 is not the gate's");
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"error":{"message":"busy","code":503}}"#
    );
}

#[tokio::test]
async fn a_streaming_client_that_leaves_closes_the_engine_request_and_frees_the_gate() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let response = within(chat(&client(), &sidecar.url)).await;
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    arrival
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    let mut stream = response.bytes_stream();
    within(stream.next()).await.unwrap().unwrap();
    assert_eq!(totals(&sidecar.gate).engine_requests, 1);

    drop(stream); // the client leaves mid-stream
    within(arrival.dropped)
        .await
        .expect("the engine's response body is dropped: its connection closed");
    until("the gate releases the request", || {
        totals(&sidecar.gate) == Counts::new(0, 0, 0)
    })
    .await;
    assert_eq!(sidecar.gate.snapshot().tally.admitted_direct, 1);
}

#[tokio::test]
async fn a_queued_client_that_leaves_never_reaches_the_engine() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    let first = within(chat(&client, &sidecar.url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();

    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("queued", || totals(&sidecar.gate).queued == 1).await;
    queued.abort(); // the client gives up
    until("the queue place is freed", || {
        totals(&sidecar.gate).queued == 0
    })
    .await;
    assert_eq!(sidecar.gate.snapshot().tally.cancelled, 1);

    // The slot frees; nothing was waiting for it, so the engine hears of
    // no one else.
    drop(running.stream);
    within(first.bytes()).await.unwrap();
    until("idle", || totals(&sidecar.gate) == Counts::new(0, 0, 0)).await;
    assert!(engine.arrivals.try_recv().is_err());
}

#[tokio::test]
async fn capacity_is_learned_from_the_engine_and_read_again_when_it_restarts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // Loading: every route answers 503, as llama.cpp does.
    let engine = engine_on(listener, 0).await;
    let gate = Gate::new(AdmissionConfig::new());
    let upstream = Upstream::new(UpstreamUrl::parse(&engine.url).unwrap(), options());
    let timing = DiscoveryTiming {
        interval: Duration::from_secs(3600),
        retry: Duration::from_millis(20),
        timeout: Duration::from_secs(2),
    };
    let discovery = proxy::discover_capacity(gate.clone(), &upstream, timing, None);
    until("the engine was asked while loading", || {
        engine.props_reads.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(gate.snapshot().capacity, None, "no report while loading");
    assert_eq!(
        gate.limits_in_force().per_rank.engine_request_limit,
        tower_admission::DEFAULT_ENGINE_LIMIT
    );

    engine.slots.store(3, Ordering::SeqCst);
    until("the capacity is reported", || {
        gate.snapshot().capacity == Some(EngineCapacity::new(3, 1))
    })
    .await;
    assert_eq!(gate.limits_in_force().per_rank.engine_request_limit, 3);
    assert_eq!(gate.limits_in_force().per_rank.request_queue_limit, 6);

    // The engine restarts with other settings, on the same address. A
    // request that finds it gone makes the sidecar ask again at once,
    // though the next scheduled read is an hour away.
    drop(engine);
    let (sidecar, _drain) = Sidecar::builder(gate.clone(), upstream.clone()).build();
    loop {
        use tower::ServiceExt;
        let request = http::Request::post("/v1/chat/completions")
            .body(http_body_util::Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = within(sidecar.clone().oneshot(request)).await.unwrap();
        if response.status() == 502 {
            break;
        }
    }
    let restarted = engine_on(tokio::net::TcpListener::bind(address).await.unwrap(), 5).await;
    until("the new capacity is reported", || {
        gate.snapshot().capacity == Some(EngineCapacity::new(5, 1))
    })
    .await;
    assert!(restarted.props_reads.load(Ordering::SeqCst) >= 1);
    discovery.abort();
}

#[tokio::test]
async fn metrics_serve_the_gate_s_series_and_optionally_the_engine_s() {
    let engine = engine(1).await;
    for merge in [false, true] {
        let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
            b.metrics(Arc::new(|| "gate_series 1\n".to_owned()))
                .merge_engine_metrics(merge)
        })
        .await;
        let response = within(client().get(format!("{}/metrics", sidecar.url)).send())
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let text = response.text().await.unwrap();
        let expected = if merge {
            "gate_series 1\nllamacpp:requests_processing 0\n"
        } else {
            "gate_series 1\n"
        };
        assert_eq!(text, expected);
    }
    // Without a renderer /metrics is the engine's, like any other route.
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let text = within(client().get(format!("{}/metrics", sidecar.url)).send())
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "llamacpp:requests_processing 0\n");
}

#[tokio::test]
async fn h2c_clients_and_h2c_engines_stream_through() {
    use http_body_util::BodyExt;
    let mut engine = engine(1).await;
    let options = UpstreamOptions {
        h2c: true,
        ..options()
    };
    let sidecar = sidecar(small_gate(), &engine.url, options, |b| b).await;
    let address = sidecar.url.strip_prefix("http://").unwrap().to_owned();
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut send, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("{}/v1/chat/completions", sidecar.url))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from_static(
            chat_body().as_bytes(),
        )))
        .unwrap();
    let response = within(send.send_request(request)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(arrival.body, chat_body());
    assert!(
        !arrival.headers.contains_key("host"),
        "HTTP/2 carries the authority"
    );
    arrival
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    let mut body = response.into_body();
    let frame = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), TOKEN.as_bytes());
    until("the first token ends waiting", || {
        totals(&sidecar.gate).engine_waiting == 0
    })
    .await;
    drop(arrival.stream);
    while within(body.frame()).await.is_some() {}
    until("released", || totals(&sidecar.gate) == Counts::new(0, 0, 0)).await;
}

#[tokio::test]
async fn a_huge_header_is_refused_before_it_takes_anything() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    for (name, value) in [
        ("x-long", "a".repeat(1 << 20)),
        ("x-data-parallel-rank", "9".repeat(1 << 20)),
    ] {
        let response = client
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .header(name, value)
            .body(chat_body())
            .send()
            .await;
        // hyper answers 431 or closes the connection; either way nothing
        // reached the gate or the engine.
        if let Ok(response) = response {
            assert_eq!(response.status(), 431, "{name}");
        }
    }
    let mut many = client.post(format!("{}/v1/chat/completions", sidecar.url));
    for n in 0..500 {
        many = many.header(format!("x-h{n}"), "1");
    }
    if let Ok(response) = many.body(chat_body()).send().await {
        assert_eq!(response.status(), 431);
    }
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    assert!(engine.arrivals.try_recv().is_err());
    // The sidecar still serves.
    let response = within(chat(&client, &sidecar.url)).await;
    assert_eq!(response.status(), 200);
    drop(within(engine.arrivals.recv()).await.unwrap().stream);
    within(response.bytes()).await.unwrap();
}

#[tokio::test]
async fn an_oversized_body_with_cost_estimation_is_413_before_admission() {
    let mut engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| {
        b.estimate_cost(true)
    })
    .await;
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        // One byte over the cost layer's default body bound, 4 MiB.
        "a".repeat((4 << 20) + 1)
    );
    let response = within(
        client()
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .body(big)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    // A body within bounds is read, weighed, and passed on unchanged.
    let response = within(chat(&client(), &sidecar.url)).await;
    assert_eq!(response.status(), 200);
    let arrival = within(engine.arrivals.recv()).await.unwrap();
    assert_eq!(arrival.body, chat_body());
    drop(arrival.stream);
    within(response.bytes()).await.unwrap();
}

#[tokio::test]
async fn with_a_context_length_a_prompt_beyond_it_is_400_before_admission() {
    let mut engine = engine(1).await;
    let cost = tower_admission::http::OpenAiCostLayer::new().max_model_len(10);
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b.cost_layer(cost)).await;
    let long = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(100)
    );
    let response = within(
        client()
            .post(format!("{}/v1/chat/completions", sidecar.url))
            .body(long)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 400);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(sidecar.gate.snapshot().tally.received, 0);
    assert!(engine.arrivals.try_recv().is_err());
}

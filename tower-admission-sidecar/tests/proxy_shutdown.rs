//! The sidecar at shutdown: the gate's own answers, counted in its
//! rejection series with reason `shutdown`.

use bytes::Bytes;
use tower_admission_sidecar::ORIGIN;

mod support;
use support::*;

// ---------------------------------------------------------------------------

#[tokio::test]
async fn at_shutdown_queued_requests_get_503_and_running_streams_finish() {
    let engine = engine(1).await;
    let sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    one_streaming_and_one_queued_at_shutdown(engine, sidecar).await;
}

#[tokio::test]
async fn on_threads_of_its_own_one_gate_serves_every_thread_and_shutdown_drains_them_all() {
    let engine = engine(1).await;
    let sidecar = sidecar_on_threads(small_gate(), &engine.url, 2, |b| b).await;
    one_streaming_and_one_queued_at_shutdown(engine, sidecar).await;
}

/// One request streaming and one queued in a gate of one slot and one
/// queue place (each on a connection of its own, so a sidecar on threads
/// serves them where they land, with the one gate): a third is refused;
/// at shutdown the queued one gets the gate's `503`, new connections are
/// refused, and the stream finishes before the server stops.
async fn one_streaming_and_one_queued_at_shutdown(mut engine: EngineServer, mut sidecar: Running) {
    let client = client();
    let first = within(chat(&client, &sidecar.url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("queued", || totals(&sidecar.gate).queued == 1).await;
    let refused = within(chat(&client, &sidecar.url)).await;
    assert_eq!(refused.status(), 529, "one slot, one queue place: full");

    let _ = sidecar.stop.take().unwrap().send(());
    let queued = within(queued).await.unwrap();
    assert_eq!(queued.status(), 503);
    assert_eq!(queued.headers()["x-admission-rejection-reason"], "shutdown");
    assert_eq!(queued.headers()["x-admission-rejection-scope"], "worker");
    assert!(
        engine.arrivals.try_recv().is_err(),
        "the queued request never ran"
    );
    // New connections are refused, whichever thread would take them.
    for _ in 0..4 {
        assert!(
            client
                .post(format!("{}/v1/chat/completions", sidecar.url))
                .body(chat_body())
                .send()
                .await
                .is_err()
        );
    }

    // The running stream still finishes, then the server stops.
    running
        .stream
        .send(Bytes::from_static(TOKEN.as_bytes()))
        .unwrap();
    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    let body = within(first.bytes()).await.unwrap();
    assert_eq!(body, format!("{TOKEN}{DONE}").as_bytes());
    within(&mut sidecar.served).await.unwrap();
    assert_eq!(totals(&sidecar.gate).engine_requests, 0);
}

#[tokio::test]
async fn at_shutdown_the_answer_is_the_gate_s_and_counted_with_reason_shutdown() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // This test's runtime runs on this thread: the gate records here.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut engine = engine(1).await;
    let mut sidecar = sidecar(small_gate(), &engine.url, options(), |b| b).await;
    let client = client();
    let first = within(chat(&client, &sidecar.url)).await;
    let running = within(engine.arrivals.recv()).await.unwrap();
    let queued = tokio::spawn({
        let (client, url) = (client.clone(), sidecar.url.clone());
        async move { chat(&client, &url).await }
    });
    until("queued", || totals(&sidecar.gate).queued == 1).await;

    let _ = sidecar.stop.take().unwrap().send(());
    let queued = within(queued).await.unwrap();
    assert_eq!(queued.status(), 503);
    assert_eq!(queued.headers()["retry-after"], "1");
    assert_eq!(queued.headers()[ORIGIN.as_str()], "proxy");
    let json: serde_json::Value = queued.json().await.unwrap();
    assert_eq!(json["error"]["type"], "overloaded");
    assert_eq!(json["error"]["code"], 503);
    assert_eq!(json["error"]["scope"], "worker");
    assert_eq!(json["error"]["reason"], "shutdown");
    let tally = sidecar.gate.snapshot().tally;
    assert_eq!((tally.shutdown_worker, tally.cancelled), (1, 0));
    let text = metrics.render();
    let series = format!(
        "{}_rejection_total{{dp_rank=\"unspecified\",scope=\"worker\",reason=\"shutdown\"}} 1",
        tower_admission::metrics::DEFAULT_PREFIX
    );
    assert!(text.contains(&series), "{text}");

    running
        .stream
        .send(Bytes::from_static(DONE.as_bytes()))
        .unwrap();
    drop(running.stream);
    assert_eq!(within(first.bytes()).await.unwrap(), DONE.as_bytes());
    within(&mut sidecar.served).await.unwrap();
}

// ---------------------------------------------------------------------------
// HTTP/2 and hostile heads.

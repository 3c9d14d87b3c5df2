//! The metrics of behaviour §6 as Prometheus renders them, after real traffic
//! through the HTTP layer: every family, its type and help, and every
//! `dp_rank` series, with `_bucket`/`_sum`/`_count` (or quantiles) for the
//! histograms, and the layer's own series of the client's view.
#![cfg(all(feature = "metrics", feature = "http"))]

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use tower::{Layer, ServiceExt};
use tower_admission::{AdmissionConfig, AdmissionLayer, EngineCapacity, Gate, RankHeader};

use exposition::Exposition;
use tower_admission_testkit::exposition;

const RANKS: [&str; 3] = ["0", "1", "unspecified"];

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs admissions, a queue admission, rank- and worker-scoped rejections
/// and a cancellation through the HTTP layer, on two ranks, with the gate's
/// metrics registered with `recorder`.
async fn traffic(recorder: &PrometheusRecorder, prefix: &str) -> Gate {
    // The layer registers the client's view with the recorder in use when
    // it is made, as the gate registers its own series.
    let (gate, layer) = metrics::with_local_recorder(recorder, || {
        let gate = Gate::new(
            AdmissionConfig::new()
                .engine_request_limit(1)
                .engine_request_waiting_limit(1)
                .request_queue_limit(1)
                .metrics_prefix(prefix)
                .capacity(EngineCapacity::new(64, 2)),
        );
        (gate.clone(), AdmissionLayer::new(gate))
    });
    let inner = tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"token"))))
    });
    let service = layer.rank(RankHeader::default()).layer(inner);
    let call = |rank: Option<&str>| {
        let mut request = Request::builder().method("POST").uri("/v1/completions");
        if let Some(rank) = rank {
            request = request.header(RankHeader::DEFAULT_NAME, rank);
        }
        let request = request.body(Full::new(Bytes::new())).unwrap();
        Box::pin(service.clone().oneshot(request))
    };

    // Rank 0: one admitted (held, waiting), one queued, one rejected
    // (rank scope: rank 1 still has room).
    let held = call(Some("0")).await.unwrap();
    let mut queued = call(Some("0"));
    assert!(futures::poll!(&mut queued).is_pending());
    let rejected = call(Some("0")).await.unwrap();
    assert_eq!(rejected.status().as_u16(), 529);

    // Rank 1: a whole request, first token and end.
    let whole = call(Some("1")).await.unwrap();
    assert_eq!(whole.status(), StatusCode::OK);
    whole.into_body().collect().await.unwrap();

    // Ending the held response admits the queued one.
    held.into_body().collect().await.unwrap();
    let admitted = queued.await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);

    // Unranked, while rank 0 is busy: combined capacity has room.
    let unranked = call(None).await.unwrap();
    unranked.into_body().collect().await.unwrap();

    // A request queued on rank 0 and cancelled by its client.
    let mut cancelled = call(Some("0"));
    assert!(futures::poll!(&mut cancelled).is_pending());
    drop(cancelled);

    // Fill the worker: rank 1 busy and its queue full, rank 0's queue full;
    // an unranked request is then rejected for the whole worker.
    let busy = call(Some("1")).await.unwrap();
    let mut queued0 = call(Some("0"));
    let mut queued1 = call(Some("1"));
    assert!(futures::poll!(&mut queued0).is_pending());
    assert!(futures::poll!(&mut queued1).is_pending());
    let worker = call(None).await.unwrap();
    assert_eq!(worker.status().as_u16(), 529);

    // Let everything drain.
    admitted.into_body().collect().await.unwrap();
    queued0.await.unwrap().into_body().collect().await.unwrap();
    busy.into_body().collect().await.unwrap();
    queued1.await.unwrap().into_body().collect().await.unwrap();
    gate
}

/// What every run must show, whatever the histogram rendering.
fn check_common(exposition: &Exposition, prefix: &str) {
    let name = |suffix: &str| format!("{prefix}_{suffix}");
    for (suffix, kind) in [
        ("engine_request_count", "gauge"),
        ("engine_request_waiting_count", "gauge"),
        ("request_queue_count", "gauge"),
        ("engine_request_limit", "gauge"),
        ("engine_request_waiting_limit", "gauge"),
        ("request_queue_limit", "gauge"),
        ("request_queue_oldest_age_seconds", "gauge"),
        ("request_receive_total", "counter"),
        ("cancellation_total", "counter"),
    ] {
        assert_eq!(
            exposition.types.get(&name(suffix)).map(String::as_str),
            Some(kind),
            "{suffix}"
        );
        let expected: BTreeSet<_> = RANKS.iter().map(|r| labels(&[("dp_rank", r)])).collect();
        assert_eq!(exposition.label_sets(&name(suffix)), expected, "{suffix}");
    }
    assert_eq!(exposition.types[&name("request_admit_total")], "counter");
    let expected: BTreeSet<_> = RANKS
        .iter()
        .flat_map(|r| ["direct", "queue"].map(|s| labels(&[("dp_rank", r), ("source", s)])))
        .collect();
    assert_eq!(
        exposition.label_sets(&name("request_admit_total")),
        expected
    );
    assert_eq!(exposition.types[&name("rejection_total")], "counter");
    let expected: BTreeSet<_> = [
        labels(&[("dp_rank", "0"), ("scope", "rank")]),
        labels(&[("dp_rank", "0"), ("scope", "worker")]),
        labels(&[("dp_rank", "1"), ("scope", "rank")]),
        labels(&[("dp_rank", "1"), ("scope", "worker")]),
        labels(&[("dp_rank", "unspecified"), ("scope", "worker")]),
    ]
    .into();
    assert_eq!(exposition.label_sets(&name("rejection_total")), expected);

    // Every family has help text.
    for family in exposition.types.keys() {
        assert!(exposition.helps.contains(family), "# HELP {family}");
    }
    // The gate's 13 families, and the 5 of the client's view (behaviour §6).
    assert_eq!(exposition.types.len(), 18, "{:?}", exposition.types);

    // The client's view: no tenant named, no bands: one label set, and no
    // `dp_rank` (the client's view is the worker's). The seven admitted
    // requests ended whole, without objectives: all finished, all goodput.
    let other = labels(&[("tenant_class", "other")]);
    for (suffix, kind) in [
        ("finished_requests_total", "counter"),
        ("goodput_requests_total", "counter"),
    ] {
        assert_eq!(exposition.types[&name(suffix)], kind, "{suffix}");
        assert_eq!(
            exposition.label_sets(&name(suffix)),
            BTreeSet::from([other.clone()]),
            "{suffix}"
        );
    }
    let client = |suffix: &str| exposition.value(&name(suffix), &[("tenant_class", "other")]);
    assert_eq!(client("finished_requests_total"), 7.0);
    assert_eq!(client("goodput_requests_total"), 7.0);
    assert_eq!(client("client_time_to_first_token_seconds_count"), 7.0);
    assert_eq!(client("client_request_duration_seconds_count"), 7.0);
    // One chunk each: no gap between chunks.
    assert_eq!(client("client_inter_token_latency_seconds_count"), 0.0);

    // The traffic, as counted.
    let count = |suffix: &str, pairs: &[(&str, &str)]| exposition.value(&name(suffix), pairs);
    assert_eq!(count("request_receive_total", &[("dp_rank", "0")]), 5.0);
    assert_eq!(count("request_receive_total", &[("dp_rank", "1")]), 3.0);
    assert_eq!(
        count("request_receive_total", &[("dp_rank", "unspecified")]),
        2.0
    );
    assert_eq!(
        count(
            "request_admit_total",
            &[("dp_rank", "0"), ("source", "direct")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "request_admit_total",
            &[("dp_rank", "0"), ("source", "queue")]
        ),
        2.0
    );
    assert_eq!(
        count(
            "request_admit_total",
            &[("dp_rank", "1"), ("source", "direct")]
        ),
        2.0
    );
    assert_eq!(
        count(
            "request_admit_total",
            &[("dp_rank", "1"), ("source", "queue")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "request_admit_total",
            &[("dp_rank", "unspecified"), ("source", "direct")]
        ),
        1.0
    );
    assert_eq!(
        count("rejection_total", &[("dp_rank", "0"), ("scope", "rank")]),
        1.0
    );
    assert_eq!(
        count(
            "rejection_total",
            &[("dp_rank", "unspecified"), ("scope", "worker")]
        ),
        1.0
    );
    assert_eq!(count("cancellation_total", &[("dp_rank", "0")]), 1.0);
    for rank in RANKS {
        assert_eq!(
            count("engine_request_count", &[("dp_rank", rank)]),
            0.0,
            "drained"
        );
        assert_eq!(
            count("request_queue_count", &[("dp_rank", rank)]),
            0.0,
            "drained"
        );
        assert_eq!(
            count("request_queue_oldest_age_seconds", &[("dp_rank", rank)]),
            0.0,
            "drained"
        );
    }
    assert_eq!(
        count("engine_request_waiting_limit", &[("dp_rank", "1")]),
        1.0
    );
    assert_eq!(
        count(
            "engine_request_waiting_limit",
            &[("dp_rank", "unspecified")]
        ),
        2.0
    );

    // Histogram counts, however rendered.
    let observations =
        |suffix: &str, rank: &str| count(&format!("{suffix}_count"), &[("dp_rank", rank)]);
    assert_eq!(observations("request_queue_wait_seconds", "0"), 2.0);
    assert_eq!(observations("request_queue_wait_seconds", "1"), 1.0);
    assert_eq!(observations("engine_request_waiting_seconds", "0"), 3.0);
    assert_eq!(observations("engine_request_waiting_seconds", "1"), 3.0);
    assert_eq!(
        observations("engine_request_waiting_seconds", "unspecified"),
        1.0
    );
    for suffix in [
        "request_queue_wait_seconds",
        "engine_request_waiting_seconds",
    ] {
        for rank in RANKS {
            let sum = count(&format!("{suffix}_sum"), &[("dp_rank", rank)]);
            assert!(sum >= 0.0, "{suffix}_sum{{dp_rank={rank}}}");
        }
    }
}

#[tokio::test]
async fn histograms_render_with_buckets() {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.01, 0.1, 1.0])
        .unwrap()
        .build_recorder();
    let gate = traffic(&recorder, "dynamo_backend_admission").await;
    assert_eq!(gate.snapshot().tally.settled(), 10);
    let text = recorder.handle().render();
    let exposition = Exposition::parse(&text);
    check_common(&exposition, "dynamo_backend_admission");
    for suffix in [
        "request_queue_wait_seconds",
        "engine_request_waiting_seconds",
    ] {
        let family = format!("dynamo_backend_admission_{suffix}");
        assert_eq!(exposition.types[&family], "histogram", "{text}");
        let buckets = exposition.label_sets(&format!("{family}_bucket"));
        for rank in RANKS {
            for le in ["0.01", "0.1", "1", "+Inf"] {
                assert!(
                    buckets.contains(&labels(&[("dp_rank", rank), ("le", le)])),
                    "{family}_bucket{{dp_rank={rank},le={le}}} in\n{text}"
                );
            }
            let count = exposition.value(&format!("{family}_count"), &[("dp_rank", rank)]);
            let infinite = exposition.value(
                &format!("{family}_bucket"),
                &[("dp_rank", rank), ("le", "+Inf")],
            );
            assert_eq!(infinite, count);
        }
    }
}

#[tokio::test]
async fn histograms_render_as_summaries_by_default() {
    let recorder = PrometheusBuilder::new().build_recorder();
    traffic(&recorder, "admission").await;
    let text = recorder.handle().render();
    let exposition = Exposition::parse(&text);
    check_common(&exposition, "admission");
    for suffix in [
        "request_queue_wait_seconds",
        "engine_request_waiting_seconds",
    ] {
        let family = format!("admission_{suffix}");
        assert_eq!(exposition.types[&family], "summary", "{text}");
        let quantiles = exposition.label_sets(&family);
        for rank in RANKS {
            assert!(
                quantiles.contains(&labels(&[("dp_rank", rank), ("quantile", "0.5")])),
                "{family}{{dp_rank={rank},quantile=0.5}} in\n{text}"
            );
        }
    }
}

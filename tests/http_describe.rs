//! The one seam that describes a request (issue 20): what a describer
//! given to `AdmissionLayer::describe` fills in reaches the gate, in
//! order after the layer's shorthands, and the shorthands keep working
//! beside it.
#![cfg(feature = "http")]

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower_admission::http::{CostHeader, Describe, GrpcTimeout};
use tower_admission::{
    AdmissionConfig, AdmissionLayer, Cost, Descriptor, EngineCapacity, Gate, RankHeader, Tenant,
};
use tower_test::mock;

type Reply = Response<Full<Bytes>>;

#[test]
fn a_described_cost_counts_against_the_token_limit() {
    let gate = Gate::new(AdmissionConfig::new().engine_waiting_token_limit(1000));
    let layer = AdmissionLayer::new(gate.clone()).describe(
        |_: &Request<()>, descriptor: &mut Descriptor| descriptor.cost = Cost::prompt(800),
    );
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);

    assert_ready_ok!(service.poll_ready());
    let mut first = task::spawn(service.call(Request::new(())));
    assert_pending!(first.poll());
    assert_ready!(engine.poll_request()).expect("800 tokens fit 1000");

    assert_ready_ok!(service.poll_ready());
    let mut second = task::spawn(service.call(Request::new(())));
    assert_pending!(second.poll());
    assert!(engine.poll_request().is_pending(), "1600 tokens do not");
    let total = gate.snapshot().total;
    assert_eq!((total.queued, total.engine_waiting_tokens), (1, 800));
    assert_eq!(total.queued_tokens, 800);
}

#[test]
fn a_describer_runs_after_the_shorthands_and_what_it_fills_in_wins() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .capacity(EngineCapacity::new(4, 2)),
    );
    // The rank header says 0; the describer added after it says 1.
    let layer = AdmissionLayer::new(gate.clone())
        .rank(RankHeader::default())
        .describe(|_: &Request<()>, descriptor: &mut Descriptor| descriptor.rank = Some(1));
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);
    let req = Request::builder()
        .header("x-data-parallel-rank", "0")
        .body(())
        .unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut call = task::spawn(service.call(req));
    assert_pending!(call.poll());
    assert_ready!(engine.poll_request()).expect("admitted");
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.ranks[0].engine_requests, 0);
    assert_eq!(snapshot.ranks[1].engine_requests, 1);
}

#[test]
fn without_a_describer_the_shorthands_describe_alone() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(4)
            .capacity(EngineCapacity::new(4, 2)),
    );
    let layer = AdmissionLayer::new(gate.clone()).rank(RankHeader::default());
    let (mut service, mut engine) = mock::spawn_layer::<Request<()>, Reply, _>(layer);
    let req = Request::builder()
        .header("x-data-parallel-rank", "0")
        .body(())
        .unwrap();

    assert_ready_ok!(service.poll_ready());
    let mut call = task::spawn(service.call(req));
    assert_pending!(call.poll());
    assert_ready!(engine.poll_request()).expect("admitted");
    assert_eq!(gate.snapshot().ranks[0].engine_requests, 1);
}

#[test]
fn the_built_in_readers_compose_as_a_tuple() {
    let describer = (
        RankHeader::new("x-dp-rank"),
        CostHeader::new("x-prompt-tokens").max_output_tokens("x-max-tokens"),
        GrpcTimeout,
        |_: &Request<()>, descriptor: &mut Descriptor| {
            descriptor.tenant = Some(Tenant::new("batch"));
        },
    );
    let req = Request::builder()
        .header("x-dp-rank", "2")
        .header("x-prompt-tokens", "100")
        .header("x-max-tokens", "20")
        .header("grpc-timeout", "3S")
        .body(())
        .unwrap();
    let descriptor = describer.descriptor(&req);
    assert_eq!(descriptor.rank, Some(2));
    assert_eq!(descriptor.cost, Cost::new(100, Some(20)));
    assert_eq!(descriptor.deadline, Some(std::time::Duration::from_secs(3)));
    assert_eq!(descriptor.tenant, Some(Tenant::new("batch")));
    assert_eq!(descriptor.priority, 0);
}

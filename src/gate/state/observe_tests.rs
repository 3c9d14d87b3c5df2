//! What the state hands observers about its queues (behaviour §8 metrics): the
//! request queued longest in each bucket, and the per-band queue lengths
//! and tallies kept only when priority bands are configured.

use std::time::Duration;

use super::qos_tests::{arrive, class, queue};
use super::tests::{busy, busy_at};
use super::*;

/// The class of an untenanted request of `priority`.
fn priority(priority: i32) -> Class {
    class(priority, None)
}

/// The name of the unranked bucket's oldest queued request.
fn oldest(state: &State<&'static str>) -> Option<&'static str> {
    state.view().oldest_queued(None).map(|(_, name)| *name)
}

/// `(queued, admitted, rejected)` of each configured band of the unranked
/// bucket, lowest first.
fn bands(state: &State<&'static str>) -> Vec<(usize, u64, u64)> {
    state
        .view()
        .bucket(None)
        .bands
        .expect("bands are configured")
        .iter()
        .map(|band| (band.queued, band.tally.admitted, band.tally.rejected))
        .collect()
}

/// [`busy_at`] a start with bands 0 and 10 on top of `config`, and `name`
/// queued then in `class`; the last is the time `later` than the start.
fn one_queued_in_bands(
    config: AdmissionConfig,
    name: &'static str,
    class: Class,
    later: Duration,
) -> (State<&'static str>, Grant, Ticket, Option<Instant>) {
    let start = Instant::now();
    let (mut state, running) = busy_at(config.priority_bands([0, 10]), 10, Some(start));
    let ticket = queue(&mut state, name, class, Some(start));
    (state, running, ticket, Some(start + later))
}

/// Frees the engine slot and hands it to the next queued request, which
/// must be `ticket`'s, at `now`.
fn serve_next(
    state: &mut State<&'static str>,
    running: &mut Grant,
    ticket: Ticket,
    now: Option<Instant>,
) {
    state.finish(running, now);
    state.drain_offered(|_, _| {});
    let Polled::Admitted(grant, _) = state.poll(ticket) else {
        panic!("the next request is admitted")
    };
    *running = grant;
}

#[test]
fn the_oldest_queued_request_is_the_earliest_arrival_whatever_its_band() {
    let (mut state, mut running) = busy(AdmissionConfig::new(), 10);
    assert_eq!(oldest(&state), None, "nothing queued");
    let low = queue(&mut state, "low", priority(0), None);
    let high = queue(&mut state, "high", priority(5), None);
    assert_eq!(oldest(&state), Some("low"), "served last, waiting longest");
    serve_next(&mut state, &mut running, high, None);
    assert_eq!(oldest(&state), Some("low"));
    let later = queue(&mut state, "later", priority(5), None);
    state.cancel(low, None).unwrap();
    assert_eq!(oldest(&state), Some("later"), "the next oldest");
    state.cancel(later, None).unwrap();
    assert_eq!(oldest(&state), None);
    state.finish(&mut running, None);
}

#[test]
fn the_oldest_queued_request_carries_its_arrival_time_only_when_the_gate_keeps_time() {
    let (mut untimed, mut running) = busy(AdmissionConfig::new(), 10);
    queue(&mut untimed, "r", priority(0), None);
    assert!(matches!(
        untimed.view().oldest_queued(None),
        Some((None, &"r"))
    ));
    untimed.finish(&mut running, None);

    let start = Instant::now();
    let config = AdmissionConfig::new().request_deadlines(true);
    let mut timed = State::new(config.engine_request_limit(1).request_queue_limit(10));
    let now = Some(start);
    let Arrival::Admitted(mut running) =
        timed.arrive(None, Demand::default(), None, "running", now)
    else {
        panic!("admitted")
    };
    let now = Some(start + Duration::from_secs(3));
    queue(&mut timed, "first", priority(0), now);
    let now = Some(start + Duration::from_secs(5));
    queue(&mut timed, "second", priority(0), now);
    let Some((Some(queued_at), &"first")) = timed.view().oldest_queued(None) else {
        panic!("the first is the oldest, with its time")
    };
    assert_eq!(queued_at, start + Duration::from_secs(3));
    timed.finish(&mut running, now);
}

#[test]
fn without_configured_bands_there_are_no_band_views_or_tallies() {
    let (mut state, mut running) = busy(AdmissionConfig::new(), 1);
    queue(&mut state, "low", priority(0), None);
    queue(&mut state, "high", priority(5), None); // displaces low
    assert!(matches!(
        arrive(&mut state, "full", priority(5), None),
        Arrival::Rejected(_)
    ));
    assert!(state.view().bucket(None).bands.is_none());
    assert_eq!(
        state.buckets.unranked.bands.capacity(),
        0,
        "never allocated"
    );
    state.finish(&mut running, None);
}

#[test]
fn band_tallies_count_each_request_under_the_band_it_arrived_in() {
    let config = AdmissionConfig::new().priority_bands([0, 10]);
    let (mut state, mut running) = busy(config, 2);
    assert_eq!(bands(&state), [(0, 1, 0), (0, 0, 0)], "running: band 0");
    let l1 = queue(&mut state, "L1", priority(3), None);
    queue(&mut state, "L2", priority(0), None);
    assert_eq!(bands(&state), [(2, 1, 0), (0, 0, 0)]);
    // A full queue: H (band 10) displaces L2, the newest of band 0.
    let h = queue(&mut state, "H", priority(12), None);
    state.drain_offered(|_, _| {});
    assert_eq!(bands(&state), [(1, 1, 1), (1, 0, 0)]);
    // No lower band left to displace for another band-0 request.
    let Arrival::Rejected(overloaded) = arrive(&mut state, "L3", priority(-7), None) else {
        panic!("a full queue")
    };
    assert_eq!(overloaded.reason(), RejectionReason::QueueFull);
    assert_eq!(bands(&state), [(1, 1, 2), (1, 0, 0)]);
    serve_next(&mut state, &mut running, h, None);
    assert_eq!(bands(&state), [(1, 1, 2), (0, 1, 0)]);
    serve_next(&mut state, &mut running, l1, None);
    assert_eq!(bands(&state), [(0, 2, 2), (0, 1, 0)]);
    state.finish(&mut running, None);
    let tally = state.view().unranked_tally();
    assert_eq!(tally.admitted(), 3, "the bands add up to the tally");
    assert_eq!(tally.rejected(), 2);
}

#[test]
fn an_aged_request_stays_in_the_band_it_arrived_in() {
    let config = AdmissionConfig::new().aging_interval(Duration::from_secs(1));
    let later = Duration::from_secs(5);
    let (mut state, mut running, low, now) = one_queued_in_bands(config, "low", priority(0), later);
    queue(&mut state, "high", priority(10), now);
    assert_eq!(bands(&state), [(1, 1, 0), (1, 0, 0)]);
    // Risen above band 10, low goes first, and counts as band 0's.
    serve_next(&mut state, &mut running, low, now);
    assert_eq!(bands(&state), [(0, 2, 0), (1, 0, 0)]);
    state.finish(&mut running, now);
}

#[test]
fn an_expired_request_is_rejected_in_its_band() {
    let config = AdmissionConfig::new().request_queue_wait_limit(Duration::from_secs(1));
    let later = Duration::from_secs(2);
    let (mut state, mut running, high, now) =
        one_queued_in_bands(config, "high", priority(10), later);
    assert!(matches!(state.expire(high, now), Expiry::Rejected(..)));
    assert_eq!(bands(&state), [(0, 1, 0), (0, 0, 1)]);
    state.finish(&mut running, now);
}

#[test]
fn a_vanished_ranks_queued_requests_move_to_the_unranked_bands_and_oldest() {
    let config = AdmissionConfig::new()
        .priority_bands([0, 10])
        .engine_request_limit(1)
        .request_queue_limit(10)
        .capacity(EngineCapacity::new(8, 2));
    let mut state: State<&'static str> = State::new(config);
    let Arrival::Admitted(mut running) =
        state.arrive(Some(1), Demand::default(), None, "running", None)
    else {
        panic!("admitted")
    };
    state.arrive_as(
        Some(1),
        Demand::default(),
        None,
        priority(10),
        "ranked",
        None,
    );
    assert_eq!(state.view().bucket(Some(1)).bands.unwrap()[1].queued, 1);
    assert!(matches!(
        state.view().oldest_queued(Some(1)),
        Some((_, &"ranked"))
    ));
    state.report_capacity(EngineCapacity::new(8, 1), None);
    assert_eq!(state.view().bucket(Some(1)).bands.unwrap()[1].queued, 0);
    assert_eq!(state.view().oldest_queued(Some(1)), None);
    assert_eq!(
        bands(&state),
        [(0, 0, 0), (1, 0, 0)],
        "tallies stay with rank 1"
    );
    assert_eq!(oldest(&state), Some("ranked"));
    state.finish(&mut running, None);
}

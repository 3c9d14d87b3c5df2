//! Token budgets across the gate's public API: requests weighed by their
//! prompt and output tokens where a token limit is set, counted alone where
//! none is.

use tower_admission::{AdmissionConfig, Cost, Descriptor, EngineCapacity, Gate, RejectionScope};

#[path = "support/gate.rs"]
mod gate_support;
use gate_support::{
    admitted_from_queue, admitted_with, assert_idle, counts, queued_with, rejected_with,
};

fn prompt(tokens: usize) -> Descriptor {
    Descriptor::new().with_cost(Cost::prompt(tokens))
}

fn waiting_tokens(limit: usize) -> Gate {
    Gate::new(AdmissionConfig::new().engine_waiting_token_limit(limit))
}

#[test]
fn without_token_limits_a_cost_changes_nothing() {
    let gate = Gate::new(AdmissionConfig::new().engine_request_limit(2));
    let _a = admitted_with(&gate, prompt(1_000_000));
    let _b = admitted_with(&gate, prompt(1_000_000));
    let _c = queued_with(&gate, prompt(1));
    assert_eq!(
        gate.snapshot().total,
        counts(2, 2, 1).with_tokens(2_000_000, 2_000_000, 1)
    );
}

#[test]
fn prompts_that_would_overflow_the_waiting_budget_queue_and_enter_in_order() {
    // Three prompts of about 800 tokens against a budget of 1000: one runs,
    // two wait, and each enters when the one before it produced a token.
    let gate = waiting_tokens(1000);
    let mut first = admitted_with(&gate, prompt(800));
    let mut second = queued_with(&gate, prompt(800));
    let mut third = queued_with(&gate, prompt(800));
    assert_eq!(gate.snapshot().total.engine_waiting_tokens, 800);
    first.first_token();
    let mut second = admitted_from_queue(&mut second);
    assert!(!third.is_woken());
    second.first_token();
    let third = admitted_from_queue(&mut third);
    drop((first, second, third));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_request_larger_than_the_whole_budget_runs_alone_rather_than_never() {
    let gate = waiting_tokens(1000);
    let alone = admitted_with(&gate, prompt(1500));
    // While it waits for its first token, nothing with tokens joins it.
    let mut small = queued_with(&gate, prompt(10));
    drop(alone);
    let small = admitted_from_queue(&mut small);
    // And once something holds the budget, the large one waits its turn.
    let mut large = queued_with(&gate, prompt(1500));
    drop(small);
    drop(admitted_from_queue(&mut large));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_small_request_never_overtakes_a_large_one_queued_before_it() {
    let gate = waiting_tokens(1000);
    let mut running = admitted_with(&gate, prompt(600));
    let mut large = queued_with(&gate, prompt(900));
    // 10 tokens would fit beside the 600, but the large one is older.
    let mut small = queued_with(&gate, prompt(10));
    assert!(!small.is_woken());
    running.first_token();
    let large = admitted_from_queue(&mut large);
    // Now 900 + 10 fits: the small one follows at once.
    let small = admitted_from_queue(&mut small);
    drop((running, large, small));
    assert_idle(&gate.snapshot());
}

#[test]
fn a_request_of_unknown_cost_is_not_held_back_by_a_token_budget() {
    let gate = waiting_tokens(100);
    let _alone = admitted_with(&gate, prompt(5000));
    let _plain = admitted_with(&gate, Descriptor::new());
    assert_eq!(gate.snapshot().total.engine_requests, 2);
}

#[test]
fn the_engine_token_limit_counts_prompt_and_output_until_the_response_ends() {
    let gate = Gate::new(AdmissionConfig::new().engine_token_limit(1000));
    let with_output = Descriptor::new().with_cost(Cost::new(100, Some(500)));
    let mut first = admitted_with(&gate, with_output);
    let mut second = queued_with(&gate, with_output);
    // A first token does not release the engine tokens: the KV cache grows.
    first.first_token();
    assert!(!second.is_woken());
    assert_eq!(gate.snapshot().total.engine_tokens, 600);
    drop(first);
    drop(admitted_from_queue(&mut second));
    assert_idle(&gate.snapshot());
}

#[test]
fn the_queue_token_limit_rejects_what_would_overflow_it() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_request_limit(1)
            .request_queue_token_limit(1800),
    );
    let _running = admitted_with(&gate, prompt(100));
    let _a = queued_with(&gate, prompt(1000));
    let _b = queued_with(&gate, prompt(800));
    assert_eq!(rejected_with(&gate, prompt(1)), RejectionScope::Worker);
    // A request of unknown cost still queues: it adds no tokens.
    let _c = queued_with(&gate, Descriptor::new());
    assert_eq!(gate.snapshot().total.queued_tokens, 1800);
}

#[test]
fn ranked_requests_fit_their_rank_budget_and_the_combined_one() {
    let gate = Gate::new(
        AdmissionConfig::new()
            .engine_waiting_token_limit(1000)
            .capacity(EngineCapacity::new(64, 2)),
    );
    let rank = |rank: u32, tokens: usize| prompt(tokens).with_rank(Some(rank));
    let _r0 = admitted_with(&gate, rank(0, 900));
    // Rank 0's budget is nearly spent; rank 1's is untouched.
    let waits = queued_with(&gate, rank(0, 200));
    let _r1 = admitted_with(&gate, rank(1, 900));
    // Combined: 1800 of 2000 waiting. An unranked 300 does not fit.
    let _unranked = queued_with(&gate, prompt(300));
    assert!(!waits.is_woken());
    let snapshot = gate.snapshot();
    assert_eq!(snapshot.ranks[0].engine_waiting_tokens, 900);
    assert_eq!(snapshot.ranks[1].engine_waiting_tokens, 900);
    assert_eq!(snapshot.unranked.queued_tokens, 300);
}

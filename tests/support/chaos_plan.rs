//! The chaos soak's random choices: what each request does (how the
//! handler answers, when the client goes away, which rank headers it sends),
//! a function of the seed and the request's index.

use super::*;

// ---- randomness ----

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// `CHAOS_SEED`, or one from the clock; printed either way.
pub fn seed() -> u64 {
    let seed = env_or(
        "CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64),
    );
    println!("CHAOS_SEED={seed}");
    seed
}

// ---- what each request does ----

/// How the handler answers the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Streams a role chunk, tokens and `[DONE]`.
    Stream,
    /// Streams, but the first token takes a while.
    SlowFirstToken,
    /// Answers 500 with a short body.
    ServerError,
    /// Streams a few chunks, then the body fails.
    BodyError,
    /// Panics before answering.
    PanicInHandler,
    /// Streams a few chunks, then panics inside the body's poll.
    PanicMidStream,
    /// Answers 200 with an already-finished (empty) body.
    EmptyBody,
    /// Streams, then ends with a trailers frame.
    Trailers,
}

pub const HANDLERS: [(Answer, u64); 8] = [
    (Answer::Stream, 54),
    (Answer::SlowFirstToken, 10),
    (Answer::ServerError, 6),
    (Answer::BodyError, 6),
    (Answer::PanicInHandler, 5),
    (Answer::PanicMidStream, 5),
    (Answer::EmptyBody, 7),
    (Answer::Trailers, 7),
];

/// What the client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAct {
    /// Reads the whole answer.
    ReadAll,
    /// Gives up after `ms` milliseconds without a response head: while
    /// queued, or admitted and waiting for the head.
    GiveUpWaiting { ms: u64 },
    /// Drops the response as soon as its head arrives: before the first token.
    DropAfterHead,
    /// Reads `chunks` chunks, then drops the response: mid-stream.
    DropMidStream { chunks: u32 },
    /// Writes half a request head and hangs up: the gate never sees it.
    HalfHead,
    /// Writes a whole head announcing a body, part of the body, and hangs up.
    HalfBody,
}

pub fn client_act(rng: &mut Rng) -> ClientAct {
    match rng.pick(&[56, 12, 10, 12, 5, 5]) {
        0 => ClientAct::ReadAll,
        1 => ClientAct::GiveUpWaiting { ms: rng.below(6) },
        2 => ClientAct::DropAfterHead,
        3 => ClientAct::DropMidStream {
            chunks: 1 + rng.below(4) as u32,
        },
        4 => ClientAct::HalfHead,
        _ => ClientAct::HalfBody,
    }
}

/// `x-data-parallel-rank` values to send: none, a rank (maybe one the
/// engine no longer reports), or garbage.
pub fn rank_values(rng: &mut Rng) -> Vec<String> {
    match rng.pick(&[30, 45, 5, 5, 5, 5, 5]) {
        0 => vec![],
        // Rank 0 is the busiest, so that its queue fills while others have room.
        1 => vec![if rng.below(2) == 0 { 0 } else { rng.below(4) }.to_string()],
        2 => vec!["7".to_owned()],
        3 => vec!["abc".to_owned()],
        4 => vec!["-1".to_owned()],
        5 => vec!["1".to_owned(), "2".to_owned()],
        _ => vec!["99999999999999999999".to_owned()],
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub handler: Answer,
    /// Tokens to stream.
    pub tokens: u32,
    /// Seeds the handler's own choices (delays, where it fails).
    pub handler_seed: u64,
    pub act: ClientAct,
    pub ranks: Vec<String>,
    /// Over HTTP/2 rather than HTTP/1.1 (raw half-requests are HTTP/1.1).
    pub http2: bool,
}

impl Plan {
    pub fn new(seed: u64, index: usize) -> Plan {
        let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        let weights: Vec<u64> = HANDLERS.iter().map(|(_, weight)| *weight).collect();
        let handler = HANDLERS[rng.pick(&weights)].0;
        Plan {
            handler,
            tokens: 2 + rng.below(12) as u32,
            handler_seed: rng.next(),
            act: client_act(&mut rng),
            ranks: rank_values(&mut rng),
            http2: rng.below(10) < 3,
        }
    }

    /// The `x-chaos` header telling the handler what to do.
    pub fn header(&self) -> String {
        format!(
            "{} {} {}",
            HANDLERS
                .iter()
                .position(|(handler, _)| *handler == self.handler)
                .unwrap(),
            self.tokens,
            self.handler_seed
        )
    }
}

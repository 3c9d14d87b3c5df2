//! First-token detectors: when does a response's *waiting* end?
//!
//! The engine request waiting limit counts admitted requests that have
//! produced neither a first generated token nor a completion. Interim
//! metadata — response headers, SSE comments and keep-alives, an OpenAI
//! chunk with only a role or empty content, gRPC headers — must not end
//! waiting. A [`FirstTokenDetector`] looks at the response head and then at
//! every data frame of one response, and says where the first generated token
//! is.
//!
//! Four detectors ship with the crate:
//!
//! * [`Auto`] (the default): one of the three below, chosen by the
//!   response's `content-type`.
//! * [`AnyData`]: the first non-empty data frame.
//! * [`OpenAiSse`]: the event streams of the OpenAI Chat Completions,
//!   Completions and Responses APIs and of Anthropic's Messages API.
//! * [`Grpc`]: the first complete length-prefixed gRPC message.
//!
//! A handler can also end waiting itself with
//! [`FirstToken::mark`](crate::http::FirstToken::mark), e.g. for a
//! non-streaming answer.
//!
//! Every detector must accept frames split at any byte, keep bounded memory,
//! and never panic, whatever the bytes. A detector decides on a byte of the
//! stream, not on a frame: waiting ends at the same byte however the body is
//! split. Those that read a framing ([`OpenAiSse`], [`Grpc`]) look at the
//! response's `content-type` first and, for any other content type, end
//! waiting at the first non-empty frame, as [`AnyData`] does.

mod any_data;
mod auto;
mod detector;
mod grpc;
mod media_type;
mod openai_json;
mod openai_sse;
mod swar;

pub use self::any_data::AnyData;
pub use self::auto::Auto;
pub use self::detector::FirstTokenDetector;
pub use self::grpc::Grpc;
pub use self::openai_sse::OpenAiSse;

//! [`CostHeader`]: what a request will cost, as a trusted router already
//! computed it and sent it in headers.

use http::{HeaderName, Request};

use super::Describe;
use crate::gate::{Cost, Descriptor};
use crate::headers::single_value;

/// A cost sent by a trusted router in request headers: prompt tokens in
/// one header, optionally the maximum output tokens in another. A missing
/// or malformed prompt header leaves the cost as it was (unknown, 0
/// tokens, unless filled in before); a malformed output header leaves the
/// output unknown. Take it from your router, never from end users: a
/// client could claim any size.
///
/// ```
/// use tower_admission::http::CostHeader;
/// use tower_admission::{AdmissionConfig, AdmissionLayer, Gate};
///
/// let gate = Gate::new(AdmissionConfig::new().engine_waiting_token_limit(1_800));
/// let layer = AdmissionLayer::new(gate)
///     .describe(CostHeader::new("x-prompt-tokens").max_output_tokens("x-max-tokens"));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct CostHeader {
    prompt_tokens: HeaderName,
    max_output_tokens: Option<HeaderName>,
}

impl CostHeader {
    /// Prompt tokens from header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        CostHeader {
            prompt_tokens: HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid cost header name: {name:?}")),
            max_output_tokens: None,
        }
    }

    /// Maximum output tokens from header `name` too.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn max_output_tokens(mut self, name: &str) -> Self {
        self.max_output_tokens = Some(
            HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid cost header name: {name:?}")),
        );
        self
    }

    /// The cost the headers of `req` give, if the prompt header holds one.
    fn read<B>(&self, req: &Request<B>) -> Option<Cost> {
        let prompt = header_number(req, &self.prompt_tokens)?;
        let output = self
            .max_output_tokens
            .as_ref()
            .and_then(|name| header_number(req, name));
        Some(Cost::new(prompt, output))
    }
}

fn header_number<B>(req: &Request<B>, name: &HeaderName) -> Option<usize> {
    single_value(req.headers(), name)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The cost from the headers, when the prompt header holds one; otherwise
/// the cost stays as it was.
impl<B> Describe<B> for CostHeader {
    #[inline]
    fn describe(&self, req: &Request<B>, descriptor: &mut Descriptor) {
        if let Some(cost) = self.read(req) {
            descriptor.cost = cost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trusted_header_gives_the_cost_and_ambiguity_gives_none() {
        let header = CostHeader::new("x-prompt-tokens").max_output_tokens("x-max-tokens");
        let req = Request::builder()
            .header("x-prompt-tokens", " 800 ")
            .header("x-max-tokens", "64")
            .body(())
            .unwrap();
        assert_eq!(header.read(&req), Some(Cost::new(800, Some(64))));
        let twice = Request::builder()
            .header("x-prompt-tokens", "1")
            .header("x-prompt-tokens", "2")
            .body(())
            .unwrap();
        assert_eq!(header.read(&twice), None);
        let bad_output = Request::builder()
            .header("x-prompt-tokens", "5")
            .header("x-max-tokens", "lots")
            .body(())
            .unwrap();
        assert_eq!(header.read(&bad_output), Some(Cost::prompt(5)));
    }

    #[test]
    fn without_a_cost_in_the_headers_the_cost_filled_in_before_stays() {
        let mut descriptor = Descriptor::new().with_cost(Cost::prompt(7));
        CostHeader::new("x-prompt-tokens").describe(&Request::new(()), &mut descriptor);
        assert_eq!(descriptor.cost, Cost::prompt(7));
    }
}

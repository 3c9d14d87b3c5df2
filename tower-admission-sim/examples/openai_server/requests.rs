//! The OpenAI requests the example server reads: chat and completion
//! bodies, their prompt's length in tokens, and the JSON extractor that turns
//! a bad body into an OpenAI-style `400`.

use super::*;

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub(crate) model: String,
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_completion_tokens: Option<u64>,
    pub(crate) n: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatMessage {
    pub(crate) role: String,
    pub(crate) content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct ContentPart {
    pub(crate) text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    pub(crate) model: String,
    pub(crate) prompt: Prompt,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) n: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Prompt {
    Text(String),
    Texts(Vec<String>),
    TokenIds(Vec<u32>),
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

/// Tokens a chat template adds around each message, and to prime the reply
/// (OpenAI's accounting for its chat models).
pub(crate) const TOKENS_PER_MESSAGE: usize = 3;
pub(crate) const TOKENS_PER_REPLY: usize = 3;

impl ChatRequest {
    pub(crate) fn prompt_tokens(&self) -> usize {
        let content = |message: &ChatMessage| match &message.content {
            None => 0,
            Some(Content::Text(text)) => common::estimate_tokens(text),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|part| part.text.as_deref())
                .map(common::estimate_tokens)
                .sum(),
        };
        self.messages
            .iter()
            .map(|message| {
                TOKENS_PER_MESSAGE + common::estimate_tokens(&message.role) + content(message)
            })
            .sum::<usize>()
            + TOKENS_PER_REPLY
    }
}

impl CompletionRequest {
    pub(crate) fn prompt_tokens(&self) -> Result<usize, ApiError> {
        match &self.prompt {
            Prompt::Text(text) => Ok(common::estimate_tokens(text)),
            Prompt::Texts(texts) if texts.len() == 1 => Ok(common::estimate_tokens(&texts[0])),
            Prompt::Texts(_) => Err(ApiError::invalid(
                "prompt: exactly one prompt per request is supported",
            )),
            Prompt::TokenIds(ids) => Ok(ids.len()),
        }
    }
}

pub(crate) fn single_choice(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::invalid(format!(
            "n: only one choice per request is supported, got {n}"
        ))),
    }
}

/// Reads a JSON body, turning every way it can be wrong into a `400` (or
/// `413` when too large) with an OpenAI-style error.
pub(crate) async fn read_json<T: DeserializeOwned>(request: Request) -> Result<T, ApiError> {
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::invalid(
            "the request body must be JSON with Content-Type: application/json",
        ));
    }
    let body = Bytes::from_request(request, &())
        .await
        .map_err(|rejection| ApiError::new(rejection.status(), rejection.body_text()))?;
    serde_json::from_slice(&body)
        .map_err(|error| ApiError::invalid(format!("invalid request body: {error}")))
}

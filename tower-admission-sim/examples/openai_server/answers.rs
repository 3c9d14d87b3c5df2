//! The example server's answers: OpenAI-style errors, and the generation
//! that becomes a stream of server-sent events or one JSON answer.

use super::*;

/// An OpenAI-style error: `{"error":{"message","type","param","code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.status.as_u16(),
            }
        });
        (self.status, Json(body)).into_response()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completion,
}

/// The answer to one request, in either API's shapes.
pub(crate) struct Answer {
    pub(crate) api: Api,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) plan: Plan,
}

impl Answer {
    pub(crate) fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.plan.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.plan.prompt_tokens + completion_tokens,
        })
    }

    /// A whole answer, once the engine has generated every token. Waiting
    /// ends at the first one, not when the whole answer reaches the body.
    pub(crate) async fn collect(
        self,
        mut tokens: TokenStream,
        first_token: Option<FirstToken>,
    ) -> Json<Value> {
        let mut text = String::new();
        let mut generated = 0;
        while let Some(token) = tokens.next_token().await {
            if let Some(first_token) = &first_token {
                first_token.mark();
            }
            text.push_str(&common::token_text(token.index));
            generated += 1;
        }
        let finish_reason = self.plan.finish_reason.as_str();
        let choice = match self.api {
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Api::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        let object = match self.api {
            Api::Chat => "chat.completion",
            Api::Completion => "text_completion",
        };
        let mut whole = self.envelope(object, json!([choice]));
        whole["usage"] = self.usage(generated);
        Json(whole)
    }

    /// A streamed answer: (chat) a role-only chunk, one chunk per token, a
    /// chunk with the `finish_reason`, (with `include_usage`) a usage chunk,
    /// then `[DONE]`. Dropping it (the client went away) cancels the
    /// request in the engine.
    pub(crate) fn stream(
        self,
        tokens: TokenStream,
        include_usage: bool,
    ) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
        let generation = Generation {
            answer: self,
            tokens,
            generated: 0,
            include_usage,
            phase: Phase::Role,
        };
        let events = futures::stream::unfold(generation, |mut generation| async move {
            let data = generation.next_event().await?;
            Some((Ok(Event::default().data(data)), generation))
        });
        Sse::new(events).keep_alive(KeepAlive::default())
    }

    /// The fields every answer and chunk has, around `choices`.
    pub(crate) fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    pub(crate) fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        }
    }

    /// One streamed chunk with one choice; `usage: null` on every chunk but
    /// the usage chunk when the client asked for usage, as OpenAI does.
    pub(crate) fn chunk(&self, choice: Value, include_usage: bool) -> String {
        let mut chunk = self.envelope(self.chunk_object(), json!([choice]));
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk.to_string()
    }

    /// The last chunk when the client asked for usage: no choices.
    pub(crate) fn usage_chunk(&self, completion_tokens: usize) -> String {
        let mut chunk = self.envelope(self.chunk_object(), json!([]));
        chunk["usage"] = self.usage(completion_tokens);
        chunk.to_string()
    }

    pub(crate) fn text_choice(&self, text: &str, finish_reason: Option<&str>) -> Value {
        match self.api {
            Api::Chat => {
                let delta = if finish_reason.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
            Api::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Role,
    Tokens,
    Finish,
    Usage,
    Done,
    End,
}

/// The state of a streamed answer.
pub(crate) struct Generation {
    pub(crate) answer: Answer,
    /// Dropped with the generation: a client that goes away cancels.
    pub(crate) tokens: TokenStream,
    pub(crate) generated: usize,
    pub(crate) include_usage: bool,
    pub(crate) phase: Phase,
}

impl Generation {
    /// The data of the next event, `None` after `[DONE]`.
    pub(crate) async fn next_event(&mut self) -> Option<String> {
        let answer = &self.answer;
        loop {
            match self.phase {
                Phase::Role => {
                    self.phase = Phase::Tokens;
                    if answer.api == Api::Chat {
                        // Interim metadata: no token yet, waiting goes on.
                        let choice = json!({
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": null,
                            "finish_reason": null,
                        });
                        return Some(answer.chunk(choice, self.include_usage));
                    }
                }
                Phase::Tokens => match self.tokens.next_token().await {
                    Some(token) => {
                        self.generated += 1;
                        let text = common::token_text(token.index);
                        let choice = answer.text_choice(&text, None);
                        return Some(answer.chunk(choice, self.include_usage));
                    }
                    None => self.phase = Phase::Finish,
                },
                Phase::Finish => {
                    self.phase = Phase::Usage;
                    let reason = answer.plan.finish_reason.as_str();
                    let choice = answer.text_choice("", Some(reason));
                    return Some(answer.chunk(choice, self.include_usage));
                }
                Phase::Usage => {
                    self.phase = Phase::Done;
                    if self.include_usage {
                        return Some(answer.usage_chunk(self.generated));
                    }
                }
                Phase::Done => {
                    self.phase = Phase::End;
                    return Some("[DONE]".to_owned());
                }
                Phase::End => return None,
            }
        }
    }
}

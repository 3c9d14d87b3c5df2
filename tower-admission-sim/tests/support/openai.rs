//! A client of the example OpenAI server for its process tests: whole
//! answers, held streams, and what a rejection or a streamed chat must
//! look like (behaviour §4).

#![allow(dead_code)] // each test binary uses part of it

use std::future::Future;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use tower_admission_testkit::exposition::Exposition;

use super::support::{FOREVER, Server, within};

/// A whole HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {:?}", self.body))
    }

    /// The `data` of each event of an event-stream body.
    pub fn events(&self) -> Vec<String> {
        self.body.split("\n\n").filter_map(event_data).collect()
    }
}

/// The data of one server-sent event; `None` for a comment or keep-alive.
pub fn event_data(event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect();
    (!data.is_empty()).then(|| data.join("\n"))
}

pub fn chat(max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "Tell me about admission control."}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
}

impl Client {
    pub fn new(server: &Server) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: server.url.clone(),
        }
    }

    pub fn request(&self, path: &str, rank: Option<u32>) -> reqwest::RequestBuilder {
        let mut request = self.http.post(format!("{}{path}", self.url));
        if let Some(rank) = rank {
            request = request.header("x-data-parallel-rank", rank);
        }
        request
    }

    /// Posts a JSON body and reads the whole answer.
    pub fn post(
        &self,
        path: &str,
        rank: Option<u32>,
        body: &Value,
    ) -> impl Future<Output = Answer> + Send + 'static {
        let request = self.request(path, rank).json(body);
        async move {
            let response = request.send().await.expect("the request failed");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response.text().await.expect("the body failed");
            Answer {
                status,
                headers,
                body,
            }
        }
    }

    /// Posts raw bytes with a content type, and reads the whole answer.
    pub async fn post_raw(&self, path: &str, content_type: &str, body: &'static str) -> Answer {
        let response = within(
            self.request(path, None)
                .header("content-type", content_type)
                .body(body)
                .send(),
        )
        .await
        .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = within(response.text()).await.unwrap();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Opens a chat stream that lasts until dropped, and reads it up to its
    /// first token: the request is admitted and no longer waiting.
    pub async fn hold(&self, rank: Option<u32>) -> Held {
        let response = within(
            self.request("/v1/chat/completions", rank)
                .json(&chat(FOREVER, true))
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{:?}",
            response.headers()
        );
        let mut held = Held {
            response,
            buffer: String::new(),
        };
        let role: Value = serde_json::from_str(&held.next_data().await).unwrap();
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        let token: Value = serde_json::from_str(&held.next_data().await).unwrap();
        assert!(
            !token["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .is_empty()
        );
        held
    }

    pub async fn metrics(&self) -> Exposition {
        let response = within(self.http.get(format!("{}/metrics", self.url)).send())
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        Exposition::parse(&within(response.text()).await.unwrap())
    }
}

/// A streamed answer held open; dropping it closes the connection.
pub struct Held {
    pub response: reqwest::Response,
    pub buffer: String,
}

impl Held {
    pub async fn next_data(&mut self) -> String {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                match event_data(&event) {
                    Some(data) => return data,
                    None => continue,
                }
            }
            let chunk = within(self.response.chunk())
                .await
                .unwrap()
                .expect("the stream ended");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[track_caller]
pub fn assert_rank_rejection(answer: &Answer, rank: u32) {
    assert_eq!(answer.status, 529, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("x-admission-rejection-scope"), Some("rank"));
    assert_eq!(
        answer.header("x-admission-rank"),
        Some(rank.to_string().as_str())
    );
    assert_eq!(answer.header("retry-after"), None, "{answer:?}");
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "overloaded");
    assert_eq!(error["code"], 529);
    assert_eq!(error["scope"], "rank");
    assert_eq!(error["rank"], rank);
    assert!(error["message"].as_str().unwrap().contains("overloaded"));
}

#[track_caller]
pub fn assert_worker_rejection(answer: &Answer) {
    assert_eq!(answer.status, 529, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("x-admission-rejection-scope"), Some("worker"));
    assert_eq!(answer.header("x-admission-rank"), None);
    assert_eq!(answer.header("retry-after"), Some("1"));
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "overloaded");
    assert_eq!(error["scope"], "worker");
    assert_eq!(error["rank"], Value::Null);
}

/// A whole streamed chat answer of `tokens` tokens, as OpenAI shapes it.
#[track_caller]
pub fn assert_streamed_chat(answer: &Answer, tokens: usize) {
    assert_eq!(answer.status, 200, "{answer:?}");
    let events = answer.events();
    assert_eq!(events.len(), tokens + 3, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let id = &chunks[0]["id"];
    assert!(id.as_str().unwrap().starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(&chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "sim");
        assert!(chunk["created"].is_u64());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["choices"][0]["delta"]["content"], "");
    for chunk in &chunks[1..=tokens] {
        let choice = &chunk["choices"][0];
        assert!(!choice["delta"]["content"].as_str().unwrap().is_empty());
        assert_eq!(choice["finish_reason"], Value::Null);
    }
    let last = &chunks[tokens + 1]["choices"][0];
    assert_eq!(last["delta"], json!({}));
    assert_eq!(last["finish_reason"], "length");
}

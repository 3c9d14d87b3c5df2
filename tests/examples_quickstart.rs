//! The README's quick start is `examples/axum_quickstart.rs`, quoted whole,
//! and it works as the README says: run as a user would, over real
//! sockets, it streams an OpenAI chat completion whose role-only first
//! chunk does not end waiting, exports its metrics on `/metrics`, and
//! prints the limits in force with their sources.
#![cfg(all(feature = "http", feature = "metrics"))]

use tower_admission_testkit as support;

use support::{Process, within};

const QUOTE: &str = "<!-- quote: examples/axum_quickstart.rs -->";

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|error| panic!("{path}: {error}"))
}

#[test]
fn the_readme_quotes_the_example_whole() {
    let readme = read("README.md");
    let quoted = readme
        .split_once(QUOTE)
        .expect("the README marks its quote")
        .1
        .trim_start()
        .strip_prefix("```rust,no_run\n")
        .expect("a Rust block follows the marker");
    let quoted = &quoted[..quoted.find("```\n").expect("the block ends")];
    let example = read("examples/axum_quickstart.rs");
    // Everything but the module's doc comment, which says how to run it.
    let code = &example[example.find("\nuse ").expect("imports") + 1..];
    assert_eq!(
        quoted, code,
        "README.md's quick start differs from the example"
    );
}

/// A Prometheus sample's value: `name{labels} value`, labels as rendered.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_quickstart_streams_exports_metrics_and_says_what_is_in_force() {
    let binary = support::cargo_build_examples(
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        None,
        &["axum_quickstart"],
    )
    .unwrap_or_else(|error| panic!("{error}"))
    .remove("axum_quickstart")
    .unwrap();
    let server = Process::spawn(
        &binary,
        &["127.0.0.1:0"],
        &[("DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT", "3")],
    );
    let (url, limits) = server.wait_for_stdout("its address and limits", |text| {
        let mut lines = text.lines();
        let url = lines.next()?.strip_prefix("listening on ")?.to_owned();
        let limits = lines.next()?.strip_prefix("admission: ")?.to_owned();
        text.ends_with('\n').then_some((url, limits))
    });
    assert!(
        limits.starts_with(
            "2 ranks (reported: max_num_seqs 256, dp_ranks 2); per rank: \
             engine request limit 3 (variable DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT), \
             engine request waiting limit 256 (default: the reported max_num_seqs), \
             request queue limit 512 (default: 2 × the reported max_num_seqs); \
             combined, for unranked requests: engine request limit 6,"
        ),
        "{limits}"
    );

    let client = reqwest::Client::new();
    let response = within(client.post(format!("{url}/v1/chat/completions")).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = within(response.text()).await.unwrap();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    assert_eq!(events.len(), 5, "{text}");
    assert!(
        events[0].contains(r#""delta":{"role":"assistant"}"#),
        "{text}"
    );
    assert!(events[1].contains(r#""content":"Hello""#), "{text}");
    assert_eq!(events[4], "[DONE]");

    let metrics = within(
        within(client.get(format!("{url}/metrics")).send())
            .await
            .unwrap()
            .text(),
    )
    .await
    .unwrap();
    let unranked = r#"{dp_rank="unspecified"}"#;
    assert_eq!(
        sample(
            &metrics,
            r#"admission_request_admit_total{dp_rank="unspecified",source="direct"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("admission_engine_request_count{unranked}")
        ),
        0.0
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("admission_engine_request_waiting_count{unranked}")
        ),
        0.0
    );
    assert_eq!(
        sample(&metrics, r#"admission_engine_request_limit{dp_rank="1"}"#),
        3.0
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("admission_engine_request_limit{unranked}")
        ),
        6.0
    );
    // Waiting ended at the first content chunk, sent at least 200 ms after
    // admission, not at the role chunk (100 ms).
    assert_eq!(
        sample(
            &metrics,
            &format!("admission_engine_request_waiting_seconds_count{unranked}")
        ),
        1.0
    );
    let waited = sample(
        &metrics,
        &format!("admission_engine_request_waiting_seconds_sum{unranked}"),
    );
    assert!(waited >= 0.2, "waiting ended after {waited} s");
}

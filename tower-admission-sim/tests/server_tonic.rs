//! The tonic example as its users run it: a separate process that streams
//! tokens to its own client and answers overload with `UNAVAILABLE`.

mod support;

use support::{FOREVER, Process};

#[test]
fn the_tonic_example_streams_tokens_and_answers_overload_with_unavailable() {
    let mut server = support::server(
        "tonic_server",
        &[
            "serve",
            "--max-num-seqs",
            "1",
            "--request-queue-limit",
            "0",
            "--max-model-len",
            "1000000",
        ],
        &[],
    );
    let url = server.url.as_str();

    let (status, stdout, stderr) = support::run(
        "tonic_server",
        &[
            "client",
            "--addr",
            url,
            "--prompt",
            "Hi",
            "--max-tokens",
            "5",
        ],
    );
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(stdout.split_whitespace().count(), 5, "{stdout:?}");
    assert!(
        stderr.contains(r#"completed: 5 tokens, finish_reason "length""#),
        "{stderr}"
    );

    // Invalid requests are INVALID_ARGUMENT: a failure, not an overload.
    let (status, _, stderr) = support::run(
        "tonic_server",
        &["client", "--addr", url, "--max-tokens", "2000000"],
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("InvalidArgument"), "{stderr}");

    // One client streams (it has printed a token), so the next is rejected.
    let streaming = Process::spawn(
        &support::example("tonic_server"),
        &[
            "client",
            "--addr",
            url,
            "--max-tokens",
            &FOREVER.to_string(),
        ],
        &[],
    );
    streaming.wait_for_stdout("a token", |text| (!text.trim().is_empty()).then_some(()));
    let (status, stdout, stderr) = support::run(
        "tonic_server",
        &["client", "--addr", url, "--max-tokens", "5"],
    );
    assert_eq!(status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("overloaded (UNAVAILABLE, worker scope)")
            && stderr.contains("retry after 1000 ms"),
        "{stderr}"
    );

    // SIGTERM stops the server cleanly once its last client is gone.
    drop(streaming);
    server.process.terminate();
    let (status, _, stderr) = server.process.wait();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
}

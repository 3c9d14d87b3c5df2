use super::super::media_type::tests::head;
use super::*;

/// One gRPC message of `len` bytes, with its header.
fn message(len: u32) -> Vec<u8> {
    messages(&[len])
}

/// gRPC messages of the lengths given, one after the other.
fn messages(lens: &[u32]) -> Vec<u8> {
    let mut stream = Vec::new();
    for &len in lens {
        stream.push(0);
        stream.extend_from_slice(&len.to_be_bytes());
        stream.resize(stream.len() + len as usize, b'm');
    }
    stream
}

/// The absolute offset of the decision on `stream`, checked to be the
/// same when the stream arrives byte by byte and split at every byte.
#[track_caller]
fn decide_any_split(stream: &[u8]) -> Option<usize> {
    let decide = |frames: &mut dyn Iterator<Item = &[u8]>| {
        let mut detector = Grpc::default();
        let mut before = 0;
        for frame in frames {
            if let Some(n) = detector.on_data(frame) {
                assert!(n > 0 && n <= frame.len());
                return Some(before + n);
            }
            before += frame.len();
        }
        None
    };
    let whole = decide(&mut std::iter::once(stream));
    assert_eq!(decide(&mut stream.chunks(1)), whole, "byte by byte");
    for split in 0..=stream.len() {
        let (head, tail) = stream.split_at(split);
        assert_eq!(decide(&mut [head, tail].into_iter()), whole, "{split}");
    }
    whole
}

#[test]
fn waiting_ends_at_the_last_byte_of_the_first_message() {
    assert_eq!(decide_any_split(&messages(&[7, 3])), Some(12));
}

#[test]
fn a_header_or_a_partial_message_does_not_end_waiting() {
    assert_eq!(decide_any_split(&message(7)[..11]), None);
    assert_eq!(decide_any_split(&[0, 0, 0, 1]), None);
}

#[test]
fn an_empty_message_ends_waiting_at_the_end_of_its_header() {
    assert_eq!(decide_any_split(&messages(&[0, 3])), Some(5));
}

#[test]
fn a_compressed_message_counts_like_any_other() {
    let mut stream = message(2);
    stream[0] = 1;
    assert_eq!(decide_any_split(&stream), Some(7));
}

#[test]
fn a_large_message_is_counted_not_buffered() {
    let mut detector = Grpc::default();
    let len = u32::MAX;
    let mut header = vec![0];
    header.extend_from_slice(&len.to_be_bytes());
    assert_eq!(detector.on_data(&header), None);
    let chunk = vec![0; 1 << 20];
    for _ in 0..4095 {
        assert_eq!(detector.on_data(&chunk), None);
    }
    let last = (1 << 20) - 1;
    assert_eq!(detector.on_data(&chunk), Some(last));
}

#[test]
fn nothing_more_is_reported_once_waiting_has_ended() {
    let mut detector = Grpc::default();
    assert_eq!(detector.on_data(&message(1)), Some(6));
    assert_eq!(detector.on_data(&message(1)), None);
}

#[test]
fn a_response_of_another_content_type_ends_waiting_at_its_first_byte() {
    for content_type in [
        "text/plain",
        "application/grpc-web-text",
        "application/grpcx",
    ] {
        let mut detector = Grpc::default();
        detector.on_response(&head(Some(content_type)));
        assert_eq!(detector.on_data(b""), None);
        assert_eq!(detector.on_data(b"AAAAAAE="), Some(1), "{content_type}");
    }
}

#[test]
fn grpc_content_types_are_read_as_messages() {
    for content_type in [
        Some("application/grpc"),
        Some("application/grpc+proto"),
        Some("Application/gRPC-Web+proto; charset=x"),
        None,
    ] {
        let mut detector = Grpc::default();
        detector.on_response(&head(content_type));
        assert_eq!(detector.on_data(&message(2)[..6]), None, "{content_type:?}");
    }
}

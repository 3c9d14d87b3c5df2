//! `RankHeader` on arbitrary header values, one or several: a request is
//! ranked only by exactly one value of plain ASCII digits that fits a
//! `u32`; anything else — signs, spaces, non-ASCII bytes, overflow, a
//! repeated header — is unranked, and nothing panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_admission::RankHeader;
use tower_admission::http::Describe;

/// The documented rule, written independently of the crate's parser.
fn expected(values: &[&[u8]]) -> Option<u32> {
    let [value] = values else {
        return None;
    };
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fuzz_target!(|values: Vec<&[u8]>| {
    let mut request = http::Request::new(());
    let mut sent = Vec::new();
    for value in values.iter().take(8) {
        // Bytes no header value may hold never reach a server's service.
        let Ok(header) = http::HeaderValue::from_bytes(value) else {
            continue;
        };
        request
            .headers_mut()
            .append(RankHeader::DEFAULT_NAME, header);
        sent.push(*value);
    }
    let rank = RankHeader::default().descriptor(&request).rank;
    assert_eq!(rank, expected(&sent), "values {sent:?}");
    // Another header name never ranks the request.
    assert_eq!(RankHeader::new("x-dp-rank").descriptor(&request).rank, None);
});

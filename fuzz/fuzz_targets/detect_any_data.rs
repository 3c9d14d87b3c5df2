//! `AnyData` on arbitrary bytes split anywhere: waiting ends at the first
//! byte of the stream, whatever the content type and the cuts.

#![no_main]

mod common;

use common::{Input, check, first_byte};
use libfuzzer_sys::fuzz_target;
use tower_admission::detect::AnyData;

fuzz_target!(|input: Input<'_>| {
    if let Some((_, decided)) = check(&AnyData, &input, false) {
        assert_eq!(decided, first_byte(input.stream));
    }
});

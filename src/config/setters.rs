//! The builder methods of [`AdmissionConfig`](super::AdmissionConfig) that
//! follow one rule per kind of setting, each declared by its docs and one
//! line: the request and token limits, and the durations.

use std::num::NonZeroUsize;

/// Builder methods that set a per-rank request or token limit and record
/// it as set in code ([`LimitSource::Code`](super::LimitSource::Code)).
/// The field's type decides what is accepted ([`LimitValue`]).
macro_rules! limit_setters {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(mut self, n: usize) -> Self {
            self.$name = Some(LimitValue::checked(stringify!($name), n));
            self.sources.$name = LimitSource::Code;
            self
        }
    )+};
}

/// Builder methods that set a duration, which must not be zero; the
/// parameter (`$what`) is what the panic message calls it.
macro_rules! duration_setters {
    ($($(#[$doc:meta])* $name:ident($what:ident);)+) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(mut self, $what: Duration) -> Self {
            assert!(
                !$what.is_zero(),
                concat!(
                    "invalid ",
                    stringify!($name),
                    ": 0 (the ",
                    stringify!($what),
                    " must be positive)"
                )
            );
            self.$name = Some($what);
            self
        }
    )+};
}

pub(super) use {duration_setters, limit_setters};

/// A limit as its field keeps it, from the `n` given to its setter.
pub(super) trait LimitValue {
    /// `n`, if `setting` accepts it; panics otherwise.
    fn checked(setting: &str, n: usize) -> Self;
}

/// The queue limit: any value, 0 disabling the queue.
impl LimitValue for usize {
    fn checked(_setting: &str, n: usize) -> Self {
        n
    }
}

/// The engine and token limits: a gate that can admit nothing is a
/// configuration error.
impl LimitValue for NonZeroUsize {
    #[track_caller]
    fn checked(setting: &str, n: usize) -> Self {
        match NonZeroUsize::new(n) {
            Some(n) => n,
            None => panic!("invalid {setting}: 0 (the limit must be a positive integer)"),
        }
    }
}

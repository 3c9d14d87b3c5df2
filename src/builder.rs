//! Builder methods that take `self` by value and set one field, declared
//! one line each.

/// Builder methods that set one field, each declared under its docs as
/// `fn name(parameter: Type) => field = value;`.
macro_rules! setters {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($param:ident: $ty:ty) => $field:ident = $value:expr;
    )+) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $param: $ty) -> Self {
            self.$field = $value;
            self
        }
    )+};
}

pub(crate) use setters;

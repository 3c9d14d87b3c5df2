//! The traits that read one thing of a request (its rank, its cost, its
//! priority and tenant), each with its closures.

/// Declares a trait that reads one thing of a request,
/// `fn $method(&self, req: &Request<B>) -> $value`, as written, and
/// implements it for every closure `Fn(&Request<B>) -> $value`.
macro_rules! request_reader {
    (
        $(#[$attr:meta])*
        pub trait $reader:ident<B> {
            $(#[$method_attr:meta])*
            fn $method:ident(&self, req: &Request<B>) -> $value:ty;
        }
    ) => {
        $(#[$attr])*
        pub trait $reader<B> {
            $(#[$method_attr])*
            fn $method(&self, req: &Request<B>) -> $value;
        }

        impl<B, F> $reader<B> for F
        where
            F: Fn(&Request<B>) -> $value,
        {
            fn $method(&self, req: &Request<B>) -> $value {
                self(req)
            }
        }
    };
}

pub(crate) use request_reader;

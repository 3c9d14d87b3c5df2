//! Panics raised on purpose by a test say so in their message; this hook
//! keeps them off stderr and lets every other panic through.

use std::sync::Once;

/// Installs, once per test binary, a panic hook that stays quiet about
/// panics whose message contains `marker`.
pub fn quiet_injected_panics(marker: &'static str) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
            if !message.is_some_and(|message| message.contains(marker)) {
                default(info);
            }
        }));
    });
}

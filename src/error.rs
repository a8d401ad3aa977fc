//! Saying an error on one line, as every layer reports it (the journal, the
//! report, an adapter's own messages). It imports nothing of the crate, so
//! the adapters (`kube`, `store`) use it without depending on `pipeline`.

/// An error and its causes on one line: `a: b: c`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

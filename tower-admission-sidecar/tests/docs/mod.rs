//! `docs/deployment.md` as the tests read it: a section by its heading,
//! and the fenced blocks of one language in it, so that a test runs or
//! checks exactly what the docs show.

#![allow(dead_code)] // each test file uses its own part

/// The deployment guide, as built into the test.
pub const DEPLOYMENT: &str = include_str!("../../../docs/deployment.md");

/// The section of `doc` whose `## ` heading starts with `heading`, up to
/// the next `## ` heading; panics if there is none.
#[track_caller]
pub fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("no section \"## {heading}\" in the docs"))
        + 1;
    let rest = &doc[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |end| end + 4);
    &rest[..end]
}

/// The bodies of the blocks fenced as ```` ```language ```` in `text`, in
/// order.
#[track_caller]
pub fn blocks<'a>(text: &'a str, language: &str) -> Vec<&'a str> {
    let fence = format!("```{language}\n");
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(&fence) {
        let body = &rest[open + fence.len()..];
        let close = body
            .find("\n```")
            .unwrap_or_else(|| panic!("an unclosed ```{language} block"));
        found.push(&body[..close + 1]);
        rest = &body[close + 4..];
    }
    found
}

/// The one block fenced as ```` ```language ```` in `text`; panics if
/// there is none or more than one.
#[track_caller]
pub fn only_block<'a>(text: &'a str, language: &str) -> &'a str {
    match blocks(text, language)[..] {
        [block] => block,
        ref other => panic!("{} ```{language} blocks, expected one", other.len()),
    }
}

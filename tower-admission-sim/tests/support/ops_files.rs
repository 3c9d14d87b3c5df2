//! Reading the operations kit's files for the live Prometheus test: the
//! alert rules and their unit tests, the PromQL blocks of
//! `docs/operations.md`, the dashboard's expressions and variables, and the
//! rules with every duration squeezed.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;

use serde_json::Value;

// ---------------------------------------------------------------------------
// Reading the files

/// The names of the alerts of a rule file (`- alert: Name` lines).
pub fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// For each alert name, whether the unit tests expect it to fire at some
/// evaluation (`exp_alerts:` with items) and not to fire at another
/// (`exp_alerts: []`).
pub fn unit_test_coverage(tests: &str) -> BTreeMap<String, (bool, bool)> {
    let mut coverage: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut current = None;
    for line in tests.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname:") {
            current = Some(name.trim().to_owned());
        } else if let Some(expected) = line.strip_prefix("exp_alerts:") {
            let name = current.take().expect("exp_alerts without an alertname");
            let entry = coverage.entry(name).or_default();
            if expected.trim() == "[]" {
                entry.1 = true;
            } else {
                entry.0 = true;
            }
        }
    }
    coverage
}

/// The PromQL expressions of the ```` ```promql ```` blocks of a Markdown
/// file: each run of lines without a blank or a comment line is one
/// expression. With the comment lines just before each, joined (empty if
/// none).
pub fn markdown_promql(markdown: &str) -> Vec<(String, String)> {
    let mut expressions = Vec::new();
    let mut in_block = false;
    let mut comment = String::new();
    let mut current: Vec<&str> = Vec::new();
    let mut after_comment = false;
    let mut flush = |current: &mut Vec<&str>, comment: &mut String| {
        if !current.is_empty() {
            expressions.push((std::mem::take(comment), current.join("\n")));
            current.clear();
        }
    };
    for line in markdown.lines() {
        let trimmed = line.trim();
        if !in_block {
            in_block = trimmed == "```promql";
            continue;
        }
        if trimmed == "```" {
            flush(&mut current, &mut comment);
            in_block = false;
        } else if trimmed.is_empty() {
            flush(&mut current, &mut comment);
        } else if let Some(text) = trimmed.strip_prefix('#') {
            flush(&mut current, &mut comment);
            if !after_comment {
                comment.clear();
            } else {
                comment.push(' ');
            }
            comment.push_str(text.trim());
        } else {
            current.push(line);
        }
        after_comment = trimmed.starts_with('#');
    }
    assert!(!in_block, "an unterminated promql block");
    expressions
}

/// Every `expr` of a Grafana dashboard (panels, rows, nested panels), with
/// the title of its panel.
pub fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
    pub fn walk(value: &Value, title: &str, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let title = map
                    .get("title")
                    .and_then(Value::as_str)
                    .unwrap_or(title)
                    .to_owned();
                if let Some(expr) = map.get("expr").and_then(Value::as_str) {
                    found.push((title.clone(), expr.to_owned()));
                }
                for (key, child) in map {
                    if key != "templating" {
                        walk(child, &title, found);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, title, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(dashboard, "", &mut found);
    found
}

/// The dashboard's variables: name → the value the test gives it, and the
/// `label_values(selector, label)` queries of the query variables, turned
/// into PromQL (`group by (label) (selector)`).
pub fn dashboard_variables(
    dashboard: &Value,
    rate_interval: &str,
    window: &str,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let mut values = BTreeMap::new();
    values.insert("__rate_interval".to_owned(), rate_interval.to_owned());
    let mut label_queries = Vec::new();
    let list = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    for variable in list {
        let name = variable["name"]
            .as_str()
            .expect("a variable name")
            .to_owned();
        match variable["type"].as_str().expect("a variable type") {
            "datasource" => {}
            "textbox" | "constant" => {
                let value = variable["query"].as_str().expect("a default value");
                values.insert(name, value.to_owned());
            }
            "custom" => {
                values.insert(name, window.to_owned());
            }
            "query" => {
                let query = variable["query"]["query"]
                    .as_str()
                    .or_else(|| variable["query"].as_str())
                    .expect("a variable query");
                let inner = query
                    .strip_prefix("label_values(")
                    .and_then(|rest| rest.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("variable {name}: not label_values: {query}"));
                let (selector, label) = inner
                    .rsplit_once(',')
                    .unwrap_or_else(|| panic!("variable {name}: label_values(selector, label)"));
                label_queries.push((
                    format!("variable {name}"),
                    format!("group by ({}) ({})", label.trim(), selector.trim()),
                ));
                assert_eq!(
                    variable["allValue"], ".*",
                    "variable {name}: All must match every value"
                );
                values.insert(name, ".*".to_owned());
            }
            other => panic!("variable {name}: unexpected type {other}"),
        }
    }
    (values, label_queries)
}

/// `expr` with Grafana's `$name` and `${name}` replaced by `values`;
/// panics on a variable it does not know.
pub fn interpolate(expr: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let value = values
            .get(name)
            .unwrap_or_else(|| panic!("unknown variable ${name} in {expr}"));
        out.push_str(value);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// A PromQL or rule-file duration (`90s`, `5m`, `1h30m`, `250ms`) in
/// milliseconds; `None` if `text` is not one.
pub fn duration_ms(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return None,
        };
        total += number * unit_ms;
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// `rules` with every `for:` duration and every range-selector or
/// subquery duration (`[5m]`, `[1h:1m]`) divided by `factor`, and how many
/// durations it rewrote.
pub fn squeeze_durations(rules: &str, factor: u64) -> (String, usize) {
    let squeeze = |text: &str| -> Option<String> {
        let ms = duration_ms(text)?;
        Some(format!("{}ms", (ms / factor).max(1)))
    };
    let mut rewritten = 0;
    let mut out = String::new();
    for line in rules.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(value) = trimmed.strip_prefix("for:") {
            let indent = &line[..line.len() - trimmed.len()];
            let value = value.trim();
            let squeezed =
                squeeze(value).unwrap_or_else(|| panic!("`for: {value}` is not a duration"));
            out.push_str(&format!("{indent}for: {squeezed}\n"));
            rewritten += 1;
            continue;
        }
        let mut rest = line;
        while let Some(open) = rest.find('[') {
            let Some(close) = rest[open..].find(']').map(|close| open + close) else {
                break;
            };
            out.push_str(&rest[..=open]);
            let inside = &rest[open + 1..close];
            let parts: Vec<Option<String>> = inside.split(':').map(squeeze).collect();
            if parts.iter().all(Option::is_some) {
                let parts: Vec<String> = parts.into_iter().map(Option::unwrap).collect();
                out.push_str(&parts.join(":"));
                rewritten += parts.len();
            } else {
                out.push_str(inside);
            }
            rest = &rest[close..];
        }
        out.push_str(rest);
    }
    (out, rewritten)
}

//! Prometheus text exposition, parsed: every sample by name and labels,
//! and the `# TYPE` and `# HELP` of every family. For the tests that read
//! the gate's metrics as Prometheus renders them, in process or scraped
//! from a server's `/metrics`
//! (`#[path = "support/exposition.rs"] mod exposition;`).

use std::collections::{BTreeMap, BTreeSet};

/// Every family of behaviour §6, by the suffix after the prefix, with its
/// `# TYPE`.
pub const FAMILIES: [(&str, &str); 12] = [
    ("engine_request_count", "gauge"),
    ("engine_request_waiting_count", "gauge"),
    ("request_queue_count", "gauge"),
    ("request_receive_total", "counter"),
    ("request_admit_total", "counter"),
    ("rejection_total", "counter"),
    ("cancellation_total", "counter"),
    ("engine_request_limit", "gauge"),
    ("engine_request_waiting_limit", "gauge"),
    ("request_queue_limit", "gauge"),
    ("request_queue_wait_seconds", "histogram"),
    ("engine_request_waiting_seconds", "histogram"),
];

/// A metric name and its labels, sorted.
pub type Series = (String, BTreeMap<String, String>);

/// One scrape, parsed.
pub struct Exposition {
    /// The text as served.
    pub text: String,
    /// `# TYPE` by family name.
    pub types: BTreeMap<String, String>,
    /// The family names that have a `# HELP` line.
    pub helps: BTreeSet<String>,
    /// Every sample's value.
    pub samples: BTreeMap<Series, f64>,
}

impl Exposition {
    /// Parses the text format (version 0.0.4). Panics on a malformed line,
    /// naming it.
    pub fn parse(text: &str) -> Exposition {
        let mut types = BTreeMap::new();
        let mut helps = BTreeSet::new();
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|line| !line.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("malformed TYPE line {line:?}"));
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, _help) = rest
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("malformed HELP line {line:?}"));
                helps.insert(name.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("malformed sample line {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (
                    name,
                    labels
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("malformed labels in {line:?}")),
                ),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("malformed label in {line:?}"));
                    (key.to_owned(), value.trim_matches('"').to_owned())
                })
                .collect();
            let value = value
                .parse()
                .unwrap_or_else(|error| panic!("malformed value in {line:?}: {error}"));
            samples.insert((name.to_owned(), labels), value);
        }
        Exposition {
            text: text.to_owned(),
            types,
            helps,
            samples,
        }
    }

    /// The value of the sample `name{labels}`; panics, showing the text,
    /// if there is none.
    #[track_caller]
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let key = (name.to_owned(), labels);
        *self
            .samples
            .get(&key)
            .unwrap_or_else(|| panic!("no sample {key:?} in\n{}", self.text))
    }

    /// The label sets of every sample named `name`.
    pub fn label_sets(&self, name: &str) -> BTreeSet<BTreeMap<String, String>> {
        self.samples
            .keys()
            .filter(|(n, _)| n == name)
            .map(|(_, labels)| labels.clone())
            .collect()
    }

    /// The sum of the samples of `name` that carry every one of `labels`
    /// (0 when there are none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((sample, have), _)| {
                sample == name
                    && labels
                        .iter()
                        .all(|&(key, value)| have.get(key).is_some_and(|have| have == value))
            })
            .map(|(_, value)| value)
            .sum()
    }
}

/// GETs `{url}/metrics` and parses the answer.
pub async fn scrape(client: &reqwest::Client, url: &str) -> Exposition {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap_or_else(|error| panic!("GET {url}/metrics: {error}"))
        .text()
        .await
        .unwrap();
    Exposition::parse(&text)
}

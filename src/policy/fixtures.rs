//! Test fleets: worker URLs and the candidate lists a policy is called with.

use super::{Candidate, RoutingInput};

/// `n` worker URLs, `http://10.0.0.<i>:8000`.
pub(crate) fn fleet(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("http://10.0.0.{i}:8000")).collect()
}

/// Candidates with nothing in flight and no engine reports.
pub(crate) fn idle<S: AsRef<str>>(urls: &[S]) -> Vec<Candidate<'_>> {
    urls.iter()
        .map(|u| Candidate {
            url: u.as_ref(),
            in_flight: 0,
            load: None,
        })
        .collect()
}

/// Candidates with the given in-flight counts.
pub(crate) fn loaded<'a, S: AsRef<str>>(urls: &'a [S], in_flight: &[usize]) -> Vec<Candidate<'a>> {
    let mut list = idle(urls);
    for (c, &n) in list.iter_mut().zip(in_flight) {
        c.in_flight = n;
    }
    list
}

/// A request carrying only prompt text.
pub(crate) fn prompt(text: &str) -> RoutingInput<'_> {
    RoutingInput {
        text: Some(text),
        ..Default::default()
    }
}

//! An error's chain in one line, each cause said once.

/// `err` and its causes, outermost first, joined by `: ` (what `{err:#}` prints), leaving out
/// every cause whose text the one before it already ends with. Many errors here say their
/// cause in their own message (`cannot connect to URI: CAUSE`) and also keep it as their
/// source; printed link by link, the chain would repeat it.
#[must_use]
pub fn one_line(err: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut before = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if before.is_empty() || !before.ends_with(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        before = text;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to {uri}: {source}")]
    struct Connect {
        uri: String,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("node {name:?}: {source}")]
    struct Node {
        name: String,
        #[source]
        source: Connect,
    }

    #[test]
    fn a_cause_already_said_by_the_error_above_it_is_said_once() {
        let io = std::io::Error::other("no such file");
        let err = anyhow::Error::new(Node {
            name: "node1".into(),
            source: Connect {
                uri: "test:///x".into(),
                source: io,
            },
        })
        .context("--hypervisor node1=test:///x: cannot open");
        assert_eq!(
            one_line(&err),
            "--hypervisor node1=test:///x: cannot open: node \"node1\": cannot connect to \
             test:///x: no such file"
        );
        // What `{:#}` says, for comparison: the same causes three times.
        assert_eq!(format!("{err:#}").matches("no such file").count(), 3);
    }

    #[test]
    fn causes_not_said_above_are_all_kept_in_order() {
        let err = anyhow::anyhow!("the innermost")
            .context("the middle")
            .context("the outermost");
        assert_eq!(one_line(&err), "the outermost: the middle: the innermost");
    }
}

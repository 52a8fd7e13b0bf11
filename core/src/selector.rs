//! Kubernetes label selectors (`kubectl get -l`): the text form parsed into requirements, and
//! whether an object's labels satisfy them.
//!
//! The grammar is Kubernetes' (`k8s.io/apimachinery/pkg/labels`): requirements separated by
//! commas, all of which must hold:
//!
//! | requirement | holds when |
//! |---|---|
//! | `key=value`, `key==value` | the label is present with that value |
//! | `key!=value` | the label is absent, or has another value |
//! | `key in (a,b)` | the label is present with one of the values |
//! | `key notin (a,b)` | the label is absent, or has none of the values |
//! | `key` | the label is present |
//! | `!key` | the label is absent |
//! | `key>N`, `key<N` | the label is present and its value, an integer, is greater (less) than N |
//!
//! Keys are qualified names (`[prefix/]name`), values label values, checked as Kubernetes
//! checks them, so a selector kubectl accepts is accepted here and one it refuses is refused
//! with the requirement and the reason. The empty selector selects everything.

use std::fmt;

/// What may be wrong with a selector's text: the requirement (or the place) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The whole selector, as given.
    pub selector: String,
    /// What is wrong, naming the requirement.
    pub reason: String,
}

/// How a requirement compares a label's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    /// `=`, `==`, `in`: present with one of the values.
    In(Vec<String>),
    /// `!=`, `notin`: absent, or with none of the values.
    NotIn(Vec<String>),
    /// `key`: present.
    Exists,
    /// `!key`: absent.
    DoesNotExist,
    /// `key>N`: present with an integer value greater than N.
    GreaterThan(i64),
    /// `key<N`: present with an integer value less than N.
    LessThan(i64),
}

/// One requirement on one label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label's key.
    pub key: String,
    /// What its value must be.
    pub operator: Operator,
}

impl Requirement {
    /// Whether a label value (`None`: the label is absent) satisfies this requirement.
    #[must_use]
    pub fn holds(&self, value: Option<&str>) -> bool {
        match (&self.operator, value) {
            (Operator::In(values), Some(v)) => values.iter().any(|x| x == v),
            (Operator::In(_) | Operator::Exists, None) => false,
            (Operator::NotIn(values), Some(v)) => !values.iter().any(|x| x == v),
            (Operator::NotIn(_) | Operator::DoesNotExist, None) => true,
            (Operator::Exists, Some(_)) => true,
            (Operator::DoesNotExist, Some(_)) => false,
            (Operator::GreaterThan(n), Some(v)) => v.parse::<i64>().is_ok_and(|v| v > *n),
            (Operator::LessThan(n), Some(v)) => v.parse::<i64>().is_ok_and(|v| v < *n),
            (Operator::GreaterThan(_) | Operator::LessThan(_), None) => false,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        match &self.operator {
            Operator::In(values) if values.len() == 1 => write!(f, "{key}={}", values[0]),
            Operator::NotIn(values) if values.len() == 1 => write!(f, "{key}!={}", values[0]),
            Operator::In(values) => write!(f, "{key} in ({})", values.join(",")),
            Operator::NotIn(values) => write!(f, "{key} notin ({})", values.join(",")),
            Operator::Exists => write!(f, "{key}"),
            Operator::DoesNotExist => write!(f, "!{key}"),
            Operator::GreaterThan(n) => write!(f, "{key}>{n}"),
            Operator::LessThan(n) => write!(f, "{key}<{n}"),
        }
    }
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// The longest selector text accepted: far more than any real one, and a bound on the work a
/// request can ask for.
pub const SELECTOR_BYTES_MAX: usize = 4_096;

impl LabelSelector {
    /// Parses `text` (Kubernetes' grammar, see the module). Whitespace around tokens is
    /// ignored; the empty text selects everything.
    ///
    /// # Errors
    /// The first thing wrong, naming the requirement: an unknown operator, a key that is not a
    /// qualified name, a value that is not a label value, an unclosed set, a non-integer for
    /// `>`/`<`, or text past [`SELECTOR_BYTES_MAX`].
    pub fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
        let fail = |reason: String| SelectorError {
            selector: text.to_owned(),
            reason,
        };
        if text.len() > SELECTOR_BYTES_MAX {
            return Err(fail(format!(
                "longer than {SELECTOR_BYTES_MAX} bytes ({})",
                text.len()
            )));
        }
        let tokens = lex(text);
        let mut parser = Parser { tokens, at: 0 };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(parser.requirement().map_err(fail)?);
            match parser.next() {
                None => break,
                Some(Token::Comma) => {}
                Some(other) => {
                    return Err(fail(format!(
                        "expected ',' after requirement {:?}, found {}",
                        requirements
                            .last()
                            .map(ToString::to_string)
                            .unwrap_or_default(),
                        other.describe()
                    )));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// The requirements, in the order written.
    #[must_use]
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True for the empty selector, which selects everything.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether labels, read through `label(key)`, satisfy every requirement.
    pub fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.holds(label(&r.key)))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<LabelSelector, SelectorError> {
        LabelSelector::parse(text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Comma,
    Open,
    Close,
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Word(w) => format!("{w:?}"),
            Token::Comma => "','".into(),
            Token::Open => "'('".into(),
            Token::Close => "')'".into(),
            Token::Not => "'!'".into(),
            Token::Equals => "'='".into(),
            Token::DoubleEquals => "'=='".into(),
            Token::NotEquals => "'!='".into(),
            Token::Greater => "'>'".into(),
            Token::Less => "'<'".into(),
        }
    }
}

fn lex(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            ',' => Token::Comma,
            '(' => Token::Open,
            ')' => Token::Close,
            '>' => Token::Greater,
            '<' => Token::Less,
            '!' if chars.next_if(|(_, c)| *c == '=').is_some() => Token::NotEquals,
            '!' => Token::Not,
            '=' if chars.next_if(|(_, c)| *c == '=').is_some() => Token::DoubleEquals,
            '=' => Token::Equals,
            _ => {
                let mut end = start + c.len_utf8();
                while let Some((i, c)) = chars.next_if(|(_, c)| !is_special(*c)) {
                    end = i + c.len_utf8();
                }
                Token::Word(text[start..end].to_owned())
            }
        };
        tokens.push(token);
    }
    tokens
}

fn is_special(c: char) -> bool {
    c.is_whitespace() || matches!(c, ',' | '(' | ')' | '!' | '=' | '<' | '>')
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        if self.peek() == Some(&Token::Not) {
            self.at += 1;
            let key = self.key("'!'")?;
            return match self.peek() {
                None | Some(Token::Comma) => Ok(Requirement {
                    key,
                    operator: Operator::DoesNotExist,
                }),
                Some(other) => Err(format!(
                    "!{key}: a requirement that the label is absent takes no operator, found {}",
                    other.describe()
                )),
            };
        }
        let key = self.key("the start of a requirement")?;
        let operator = match self.peek().cloned() {
            None | Some(Token::Comma) => Operator::Exists,
            Some(Token::Equals | Token::DoubleEquals) => {
                self.at += 1;
                Operator::In(vec![self.value(&key)?])
            }
            Some(Token::NotEquals) => {
                self.at += 1;
                Operator::NotIn(vec![self.value(&key)?])
            }
            Some(Token::Greater) => {
                self.at += 1;
                Operator::GreaterThan(self.integer(&key, ">")?)
            }
            Some(Token::Less) => {
                self.at += 1;
                Operator::LessThan(self.integer(&key, "<")?)
            }
            Some(Token::Word(w)) if w == "in" => {
                self.at += 1;
                Operator::In(self.set(&key, "in")?)
            }
            Some(Token::Word(w)) if w == "notin" => {
                self.at += 1;
                Operator::NotIn(self.set(&key, "notin")?)
            }
            Some(other) => {
                return Err(format!(
                    "{key}: expected one of =, ==, !=, in, notin, >, < or ',', found {}",
                    other.describe()
                ));
            }
        };
        Ok(Requirement { key, operator })
    }

    fn key(&mut self, after: &str) -> Result<String, String> {
        match self.next() {
            Some(Token::Word(key)) => {
                check_key(&key).map_err(|why| format!("key {key:?}: {why}"))?;
                Ok(key)
            }
            Some(other) => Err(format!(
                "expected a label key at {after}, found {}",
                other.describe()
            )),
            None => Err(format!("expected a label key at {after}, found the end")),
        }
    }

    /// A value after `=`, `==` or `!=`: may be empty (`key=` selects an empty value).
    fn value(&mut self, key: &str) -> Result<String, String> {
        match self.peek().cloned() {
            Some(Token::Word(value)) => {
                self.at += 1;
                check_value(&value).map_err(|why| format!("{key}: value {value:?}: {why}"))?;
                Ok(value)
            }
            None | Some(Token::Comma) => Ok(String::new()),
            Some(other) => Err(format!(
                "{key}: expected a value, found {}",
                other.describe()
            )),
        }
    }

    fn integer(&mut self, key: &str, op: &str) -> Result<i64, String> {
        match self.next() {
            Some(Token::Word(w)) => w.parse::<i64>().map_err(|_| {
                format!("{key}{op}{w}: '{op}' compares with an integer, and {w:?} is not one")
            }),
            _ => Err(format!("{key}{op}: '{op}' needs an integer after it")),
        }
    }

    fn set(&mut self, key: &str, op: &str) -> Result<Vec<String>, String> {
        if self.next() != Some(Token::Open) {
            return Err(format!(
                "{key} {op}: expected '(' and a list of values, as in {key} {op} (a,b)"
            ));
        }
        let mut values = Vec::new();
        loop {
            match self.next() {
                Some(Token::Word(value)) => {
                    check_value(&value).map_err(|why| format!("{key}: value {value:?}: {why}"))?;
                    values.push(value);
                }
                // An empty value: `in (a,)` or `in ()`, as Kubernetes reads them.
                Some(Token::Comma) => {
                    values.push(String::new());
                    continue;
                }
                Some(Token::Close) => {
                    values.push(String::new());
                    break;
                }
                Some(other) => {
                    return Err(format!(
                        "{key} {op}: expected a value, found {}",
                        other.describe()
                    ));
                }
                None => {
                    return Err(format!(
                        "{key} {op}: the set of values is not closed by ')'"
                    ));
                }
            }
            match self.next() {
                Some(Token::Comma) => {}
                Some(Token::Close) => break,
                Some(other) => {
                    return Err(format!(
                        "{key} {op}: expected ',' or ')' in the set of values, found {}",
                        other.describe()
                    ));
                }
                None => {
                    return Err(format!(
                        "{key} {op}: the set of values is not closed by ')'"
                    ));
                }
            }
        }
        values.sort();
        values.dedup();
        Ok(values)
    }
}

/// The longest name part of a key, and the longest value (Kubernetes' 63).
const NAME_BYTES_MAX: usize = 63;
/// The longest prefix of a key (a DNS subdomain).
const PREFIX_BYTES_MAX: usize = 253;

/// Whether `key` is a label key Kubernetes accepts (a qualified name: `[prefix/]name`, the name
/// 1–63 alphanumerics with `-`, `_`, `.` inside, the prefix a lowercase DNS subdomain); the
/// reason if not.
///
/// # Errors
/// Why the key is not one.
pub fn check_label_key(key: &str) -> Result<(), String> {
    check_key(key)
}

/// Whether `value` is a label value Kubernetes accepts (empty, or 1–63 alphanumerics with `-`,
/// `_`, `.` inside); the reason if not.
///
/// # Errors
/// Why the value is not one.
pub fn check_label_value(value: &str) -> Result<(), String> {
    check_value(value)
}

/// A qualified name: `[prefix/]name`, the name 1–63 alphanumerics with `-`, `_`, `.` inside,
/// the prefix a lowercase DNS subdomain.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && let Some(why) = crate::validate::dns_subdomain(prefix, PREFIX_BYTES_MAX)
    {
        return Err(format!("the prefix (as in example.com/name): {why}"));
    }
    if name.is_empty() {
        return Err("the name part must not be empty".into());
    }
    check_name(name)
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value)
}

fn check_name(s: &str) -> Result<(), String> {
    if s.len() > NAME_BYTES_MAX {
        return Err(format!("must be no more than {NAME_BYTES_MAX} characters"));
    }
    let inner_ok = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends_ok = s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and \
             end with an alphanumeric character"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        let map = labels(pairs);
        LabelSelector::parse(selector)
            .unwrap_or_else(|e| panic!("{e}"))
            .matches(|k| map.get(k).map(String::as_str))
    }

    #[test]
    fn equality_requirements_select_by_value_and_inequality_admits_an_absent_label() {
        assert!(selects("app=web", &[("app", "web")]));
        assert!(selects("app==web", &[("app", "web"), ("tier", "x")]));
        assert!(!selects("app=web", &[("app", "db")]));
        assert!(!selects("app=web", &[]));
        assert!(selects("app!=web", &[("app", "db")]));
        assert!(selects("app!=web", &[]));
        assert!(!selects("app!=web", &[("app", "web")]));
    }

    #[test]
    fn every_requirement_must_hold() {
        let pairs = [("app", "web"), ("tier", "front")];
        assert!(selects("app=web,tier=front", &pairs));
        assert!(selects(" app = web , tier ", &pairs));
        assert!(!selects("app=web,tier=back", &pairs));
        assert!(!selects("app=web,!tier", &pairs));
    }

    #[test]
    fn set_requirements_and_existence() {
        let pairs = [("env", "prod")];
        assert!(selects("env in (prod, staging)", &pairs));
        assert!(!selects("env in (dev,staging)", &pairs));
        assert!(selects("env notin (dev,staging)", &pairs));
        assert!(selects("zone notin (a)", &pairs));
        assert!(selects("env", &pairs));
        assert!(!selects("zone", &pairs));
        assert!(selects("!zone", &pairs));
        assert!(!selects("!env", &pairs));
    }

    #[test]
    fn greater_and_less_compare_integer_values_only() {
        assert!(selects("gen>3", &[("gen", "4")]));
        assert!(!selects("gen>3", &[("gen", "3")]));
        assert!(!selects("gen>3", &[("gen", "four")]));
        assert!(!selects("gen>3", &[]));
        assert!(selects("gen<3", &[("gen", "-1")]));
    }

    #[test]
    fn an_empty_value_is_a_value() {
        assert!(selects("app=", &[("app", "")]));
        assert!(!selects("app=", &[("app", "web")]));
        assert!(selects("app in (web,)", &[("app", "")]));
    }

    #[test]
    fn the_empty_selector_selects_everything() {
        let s = LabelSelector::parse("  ").unwrap_or_else(|e| panic!("{e}"));
        assert!(s.is_empty());
        assert!(selects("", &[]));
    }

    #[test]
    fn prefixed_keys_are_qualified_names() {
        assert!(selects(
            "app.kubernetes.io/name=web",
            &[("app.kubernetes.io/name", "web")]
        ));
        assert!(selects(
            "kubevirt.io/domain in (testvm)",
            &[("kubevirt.io/domain", "testvm")]
        ));
    }

    #[test]
    fn it_prints_back_in_the_canonical_form() {
        let s = LabelSelector::parse("b notin (y, x),a==1, !c,d, e>2")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.to_string(), "b notin (x,y),a=1,!c,d,e>2");
        assert_eq!(LabelSelector::parse(&s.to_string()), Ok(s));
    }

    #[test]
    fn malformed_selectors_are_refused_naming_the_requirement_and_the_reason() {
        let cases = [
            (
                "app=web tier=x",
                "expected ',' after requirement \"app=web\"",
            ),
            ("app=-web", "app: value \"-web\": must consist of"),
            (
                "App_/x=y",
                "key \"App_/x\": the prefix (as in example.com/name): a lowercase RFC 1123 subdomain",
            ),
            (
                "=web",
                "expected a label key at the start of a requirement, found '='",
            ),
            (
                "app in (a,b",
                "app in: the set of values is not closed by ')'",
            ),
            ("app in a,b", "app in: expected '(' and a list of values"),
            ("app>x", "app>x: '>' compares with an integer"),
            (
                "!app=web",
                "!app: a requirement that the label is absent takes no operator",
            ),
            (
                "app,",
                "expected a label key at the start of a requirement, found the end",
            ),
            (
                "app ~ web",
                "app: expected one of =, ==, !=, in, notin, >, < or ','",
            ),
        ];
        for (text, reason) in cases {
            match LabelSelector::parse(text) {
                Ok(s) => panic!("{text:?} was accepted as {s:?}"),
                Err(e) => {
                    assert!(e.reason.contains(reason), "{text:?}: {e}");
                    assert!(
                        e.to_string()
                            .starts_with(&format!("label selector {text:?}: "))
                    );
                }
            }
        }
        let long = format!("app={}", "a".repeat(64));
        assert!(LabelSelector::parse(&long).is_err());
        let huge = "a,".repeat(SELECTOR_BYTES_MAX);
        assert!(LabelSelector::parse(&huge).is_err_and(|e| e.reason.contains("longer than")));
    }
}

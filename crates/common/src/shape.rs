//! Problem shapes as ordered `key=value` integer lists (`rows=4096,C=768`).

use serde::Serialize;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Shape(Vec<(String, i64)>);

impl Shape {
    pub fn new(pairs: &[(&str, i64)]) -> Shape {
        Shape(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    /// Parses `k=v,k=v`; values are integers (underscores allowed, e.g. `32_768`).
    pub fn parse(text: &str) -> Result<Shape> {
        let mut pairs = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| Error::ShapeSyntax(text.to_string()))?;
            let digits = v.trim().replace('_', "");
            let v: i64 = match digits.parse() {
                Ok(v) => v,
                // All digits but too many of them: a value out of range, not a syntax error.
                Err(_) if is_integer_literal(&digits) => {
                    return Err(Error::ShapeValue { key: k.trim().to_string(), value: v.trim().to_string() })
                }
                Err(_) => {
                    return Err(Error::ShapeNotInteger { key: k.trim().to_string(), value: v.trim().to_string() })
                }
            };
            let key = k.trim().to_string();
            if key.is_empty() {
                return Err(Error::ShapeSyntax(text.to_string()));
            }
            if pairs.iter().any(|(have, _)| *have == key) {
                return Err(Error::ShapeKeyRepeated { key, text: text.to_string() });
            }
            pairs.push((key, v));
        }
        if pairs.is_empty() {
            return Err(Error::ShapeSyntax(text.to_string()));
        }
        Ok(Shape(pairs))
    }

    pub fn get(&self, key: &str) -> Option<i64> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// The value of `key`, which must be present (an op's shapes always carry all their keys).
    pub fn req(&self, key: &str) -> Result<i64> {
        self.get(key).ok_or_else(|| Error::constraint(format!("shape has key {key}"), self.to_string()))
    }

    /// `key` as a count in `1..=max`, for sizes and indices.
    pub fn dim(&self, key: &str, max: i64) -> Result<usize> {
        let v = self.req(key)?;
        if v < 1 || v > max {
            return Err(Error::constraint(format!("1 <= {key} <= {max}"), format!("{key} = {v}")));
        }
        Ok(v as usize)
    }

    pub fn set(&mut self, key: &str, value: i64) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    /// `self` with every key of `overrides` replaced or added; unknown keys are rejected against
    /// `known` so a typo is an error, not a silently ignored setting.
    pub fn overlay(&self, overrides: &Shape, known: &[&str]) -> Result<Shape> {
        let mut out = self.clone();
        for (k, v) in &overrides.0 {
            if !known.contains(&k.as_str()) {
                return Err(Error::Unknown { what: "shape key", name: k.clone(), known: known.join(", ") });
            }
            out.set(k, *v);
        }
        Ok(out)
    }

    pub fn pairs(&self) -> &[(String, i64)] {
        &self.0
    }
}

/// An optional sign and one or more digits.
fn is_integer_literal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        let s = Shape::parse("rows=4096, C=768").unwrap();
        assert_eq!(s.get("rows"), Some(4096));
        assert_eq!(s.to_string(), "rows=4096,C=768");
        assert!(Shape::parse("rows").is_err());
        assert!(Shape::parse("rows=x").is_err());
        assert!(Shape::parse("").is_err());
        assert!(matches!(Shape::parse("rows=99999999999999999999"), Err(Error::ShapeValue { .. })));
        assert!(matches!(Shape::parse("rows=-"), Err(Error::ShapeNotInteger { .. })));
        let e = Shape::parse("rows=abc,C=768").unwrap_err().to_string();
        assert_eq!(e, "shape value rows=abc is not an integer");
        let e = Shape::parse("C=768,C=1024").unwrap_err().to_string();
        assert!(e.contains("shape key C given twice"), "{e}");
        assert!(matches!(Shape::parse("=5"), Err(Error::ShapeSyntax(_))));
    }

    #[test]
    fn overlay_rejects_unknown_keys() {
        let base = Shape::new(&[("rows", 1), ("C", 2)]);
        let o = base.overlay(&Shape::parse("C=5").unwrap(), &["rows", "C"]).unwrap();
        assert_eq!(o.to_string(), "rows=1,C=5");
        assert!(base.overlay(&Shape::parse("X=5").unwrap(), &["rows", "C"]).is_err());
    }

    #[test]
    fn dim_checks_range() {
        let s = Shape::new(&[("C", 0)]);
        let e = s.dim("C", 10).unwrap_err().to_string();
        assert!(e.contains("1 <= C <= 10") && e.contains("C = 0"), "{e}");
    }

    proptest! {
        #[test]
        fn roundtrip(values in proptest::collection::vec(-1_000_000i64..1_000_000, 1..6)) {
            let pairs: Vec<(String, i64)> = values.iter().enumerate().map(|(i, v)| (format!("k{i}"), *v)).collect();
            let s = Shape(pairs);
            prop_assert_eq!(Shape::parse(&s.to_string()).unwrap(), s);
        }
    }
}

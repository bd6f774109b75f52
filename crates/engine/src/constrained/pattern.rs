//! Strings matching a regular expression, generated from its syntax tree
//! (`regex-syntax`'s HIR): literals as written, one character of each
//! class (printable ASCII when the class has any), repetitions between
//! their minimum and a few more, one branch of each alternation, anchors
//! as nothing. Every candidate is checked against the compiled expression
//! (whole-string match) and a fresh one drawn when the tree walk could not
//! see a constraint (`\b` between two letters, say).

use regex_syntax::hir::{Class, Hir, HirKind};

use super::Rng;

/// Repetitions go at most this far past their minimum.
const EXTRA_REPEATS: u32 = 3;
/// Candidates drawn before giving up.
const ATTEMPTS: usize = 16;

/// A compiled regular expression that strings can be drawn from.
#[derive(Debug, Clone)]
pub struct PatternGuide {
    hir: Hir,
    whole: regex::Regex,
}

impl PatternGuide {
    /// Parses `pattern`; `Err` says why it cannot be used.
    pub fn compile(pattern: &str) -> Result<Self, String> {
        let hir = regex_syntax::Parser::new()
            .parse(pattern)
            .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))?;
        let whole = regex::Regex::new(&format!(r"\A(?:{pattern})\z"))
            .map_err(|e| format!("invalid regular expression {pattern:?}: {e}"))?;
        Ok(PatternGuide { hir, whole })
    }

    /// A string the whole of which matches, at most `budget` bytes long.
    pub fn generate(&self, rng: &mut Rng, budget: usize) -> Result<String, String> {
        let mut last_problem = String::new();
        for _ in 0..ATTEMPTS {
            let mut out = String::new();
            match walk(&self.hir, rng, &mut out, budget) {
                Ok(()) if self.whole.is_match(&out) => return Ok(out),
                Ok(()) => last_problem = format!("no match found (last try {out:?})"),
                Err(problem) => return Err(problem),
            }
        }
        Err(format!(
            "cannot generate a string matching {}: {last_problem}",
            self.whole.as_str()
        ))
    }
}

/// Appends one string of `hir`'s language to `out`.
fn walk(hir: &Hir, rng: &mut Rng, out: &mut String, budget: usize) -> Result<(), String> {
    if out.len() > budget {
        return Err(format!(
            "the expression's strings are longer than {budget} bytes"
        ));
    }
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Ok(()),
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0)
                .map_err(|_| "a literal is not valid UTF-8".to_owned())?;
            out.push_str(text);
            Ok(())
        }
        HirKind::Class(class) => {
            out.push(pick_char(class, rng)?);
            Ok(())
        }
        HirKind::Repetition(rep) => {
            if rep.min as usize > budget {
                return Err(format!(
                    "the expression repeats something {} times; answers are at most {budget} bytes",
                    rep.min
                ));
            }
            let top = rep
                .max
                .unwrap_or(u32::MAX)
                .min(rep.min.saturating_add(EXTRA_REPEATS));
            let count = rng.between(u64::from(rep.min), u64::from(top));
            (0..count).try_for_each(|_| walk(&rep.sub, rng, out, budget))
        }
        HirKind::Capture(capture) => walk(&capture.sub, rng, out, budget),
        HirKind::Concat(parts) => parts.iter().try_for_each(|h| walk(h, rng, out, budget)),
        HirKind::Alternation(branches) => {
            let pick = rng.below(branches.len() as u64) as usize;
            walk(&branches[pick], rng, out, budget)
        }
    }
}

/// One character of `class`: printable ASCII when it has some.
fn pick_char(class: &Class, rng: &mut Rng) -> Result<char, String> {
    let ranges: Vec<(u32, u32)> = match class {
        Class::Unicode(c) => c
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        Class::Bytes(c) => c
            .ranges()
            .iter()
            .filter(|r| r.start() < 0x80)
            .map(|r| (u32::from(r.start()), u32::from(r.end().min(0x7f))))
            .collect(),
    };
    let printable: Vec<(u32, u32)> = ranges
        .iter()
        .filter_map(|&(lo, hi)| {
            let (lo, hi) = (lo.max(0x20), hi.min(0x7e));
            (lo <= hi).then_some((lo, hi))
        })
        .collect();
    let pool = if printable.is_empty() {
        &ranges
    } else {
        &printable
    };
    let total: u64 = pool.iter().map(|&(lo, hi)| u64::from(hi - lo) + 1).sum();
    if total == 0 {
        return Err("a character class matches nothing this engine can write".to_owned());
    }
    let mut n = rng.below(total);
    for &(lo, hi) in pool {
        let size = u64::from(hi - lo) + 1;
        if n < size {
            return char::from_u32(lo + n as u32)
                .ok_or_else(|| "a character class holds no valid character".to_owned());
        }
        n -= size;
    }
    Err("a character class matches nothing this engine can write".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(pattern: &str, seeds: u64) -> Vec<String> {
        let guide = PatternGuide::compile(pattern).unwrap_or_else(|e| panic!("{e}"));
        (0..seeds)
            .map(|seed| {
                let mut rng = Rng::seeded(seed);
                guide
                    .generate(&mut rng, 4096)
                    .unwrap_or_else(|e| panic!("{pattern}: {e}"))
            })
            .collect()
    }

    #[test]
    fn outputs_match_their_expression() {
        let patterns = [
            r"[a-z]+@iris\.dev",
            r"^\d{3}-\d{4}$",
            r"(yes|no|maybe)",
            r"[A-F0-9]{8}(-[A-F0-9]{4}){3}",
            r"\w+\s\w+",
            r"(?i)hello [^\n]{0,5}!",
            r"a*b?c{2,}",
            r"\bword\b",
            r"[é€]x",
            r"",
        ];
        for pattern in patterns {
            let check =
                regex::Regex::new(&format!(r"\A(?:{pattern})\z")).unwrap_or_else(|e| panic!("{e}"));
            for text in draws(pattern, 20) {
                assert!(check.is_match(&text), "{pattern}: {text:?}");
            }
        }
    }

    #[test]
    fn seeds_vary_and_repeat() {
        let a = draws(r"[a-z]{4,12}", 8);
        assert_eq!(a, draws(r"[a-z]{4,12}", 8));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 4, "{a:?}");
    }

    #[test]
    fn impossible_and_huge_are_refused() {
        let never = PatternGuide::compile(r"a\bb").unwrap_or_else(|e| panic!("{e}"));
        assert!(never.generate(&mut Rng::seeded(1), 4096).is_err());
        let huge = PatternGuide::compile(r"a{100000}").unwrap_or_else(|e| panic!("{e}"));
        let err = huge
            .generate(&mut Rng::seeded(1), 4096)
            .err()
            .unwrap_or_default();
        assert!(err.contains("at most 4096 bytes"), "{err}");
        let long = PatternGuide::compile(r"(abcdefgh){600}").unwrap_or_else(|e| panic!("{e}"));
        let err = long
            .generate(&mut Rng::seeded(1), 4096)
            .err()
            .unwrap_or_default();
        assert!(err.contains("longer than 4096"), "{err}");
        assert!(PatternGuide::compile("a(").is_err());
    }
}

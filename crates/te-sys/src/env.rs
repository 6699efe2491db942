//! Settings from the environment. Each variable is defined once, as a [`Setting`], by the crate
//! that reads it (its `settings.rs`), and read through an [`Env`], which names the variable in
//! every refusal. `cargo xtask config` writes `docs/configuration.md` from those definitions.

use std::str::FromStr;

use crate::error::{Error, Result};

/// One environment variable: its name, what values it takes (its type, bounds and what applies
/// when it is unset) and what it does. The reader takes its bounds and default from here, and
/// `docs/configuration.md` is written from here, so the two cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The variable, `MC_…`.
    pub name: &'static str,
    /// Its values.
    pub value: Value,
    /// What it does, in a sentence or two.
    pub doc: &'static str,
}

/// The values a [`Setting`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A whole number in `min..=max`.
    Number {
        /// What applies when it is unset.
        unset: Unset,
        /// The least value taken.
        min: u64,
        /// The greatest value taken.
        max: u64,
    },
    /// A byte count with an optional `K`, `M`, `G` or `T` suffix, in `min..=max` bytes.
    Bytes {
        /// What applies when it is unset.
        unset: Unset,
        /// The least value taken.
        min: u64,
        /// The greatest value taken.
        max: u64,
    },
    /// A switch: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.
    Flag {
        /// Whether it is on when unset.
        unset: bool,
    },
    /// Anything else, in words.
    Text {
        /// What applies when it is unset.
        unset: &'static str,
        /// The values taken.
        values: &'static str,
    },
}

/// What applies when a number is unset: a value, or a rule in words (`the host's`, `off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unset {
    /// This value.
    Is(u64),
    /// This rule.
    Means(&'static str),
}

impl Setting {
    /// `value` as this setting's number (a byte count for [`Value::Bytes`]), within its bounds.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable: not a number, out of bounds, or too large
    /// for `T`; or this setting is no number.
    pub fn number<T: TryFrom<u64>>(&self, value: &str) -> Result<T> {
        let n = match self.value {
            Value::Number { min, max, .. } => number_in(self.name, value, min, max)?,
            Value::Bytes { min, max, .. } => {
                let n = size(self.name, value)?;
                if n < min || n > max {
                    return Err(invalid(
                        self.name,
                        value,
                        format!(
                            "must be between {} and {}",
                            bytes_text(min),
                            bytes_text(max)
                        ),
                    ));
                }
                n
            }
            Value::Flag { .. } | Value::Text { .. } => {
                return Err(invalid(self.name, value, "not a numeric setting"));
            }
        };
        T::try_from(n).map_err(|_| invalid(self.name, value, "too large for this machine"))
    }

    /// The number that applies when it is unset.
    ///
    /// # Panics
    /// When the definition gives no number for that (a rule in words, or no numeric setting),
    /// or one `T` cannot hold: a mistake in te's own tables, caught by their tests.
    pub fn initial<T: TryFrom<u64>>(&self) -> T {
        let n = match self.value {
            Value::Number {
                unset: Unset::Is(n),
                ..
            }
            | Value::Bytes {
                unset: Unset::Is(n),
                ..
            } => n,
            Value::Flag { unset } => u64::from(unset),
            _ => panic!("{}: its definition has no value for unset", self.name),
        };
        T::try_from(n).unwrap_or_else(|_| panic!("{}: default {n} out of its type", self.name))
    }

    /// Whether a switch is on when unset (false for any other setting).
    pub fn on_by_default(&self) -> bool {
        matches!(self.value, Value::Flag { unset: true })
    }

    /// What applies when it is unset, as a user reads it.
    pub fn default_text(&self) -> String {
        match self.value {
            Value::Number { unset, .. } => unset_text(unset, |n| n.to_string()),
            Value::Bytes { unset, .. } => unset_text(unset, bytes_text),
            Value::Flag { unset } => if unset { "on" } else { "off" }.to_string(),
            Value::Text { unset, .. } => unset.to_string(),
        }
    }

    /// The values it takes, as a user reads them.
    pub fn values_text(&self) -> String {
        match self.value {
            Value::Number { min, max, .. } => format!("{min}–{max}"),
            Value::Bytes { min, max, .. } => {
                format!("{}–{} (K/M/G/T suffixes)", bytes_text(min), bytes_text(max))
            }
            Value::Flag { .. } => "0/1".to_string(),
            Value::Text { values, .. } => values.to_string(),
        }
    }
}

fn unset_text(unset: Unset, show: impl Fn(u64) -> String) -> String {
    match unset {
        Unset::Is(n) => show(n),
        Unset::Means(words) => words.to_string(),
    }
}

/// A byte count in its largest exact binary unit (`64 KiB`, `1 GiB`, `4097 B`).
pub fn bytes_text(n: u64) -> String {
    const UNITS: [(u32, &str); 5] = [
        (50, "PiB"),
        (40, "TiB"),
        (30, "GiB"),
        (20, "MiB"),
        (10, "KiB"),
    ];
    for (shift, unit) in UNITS {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

/// Where settings are read: the process environment, or any lookup (tests, a configuration
/// file mapped to variables).
pub struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Env<'a> {
    /// Reads through `lookup`.
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Env { lookup }
    }

    /// The value as given, blank or not (secrets, where spaces may matter).
    pub fn raw(&self, s: &Setting) -> Option<String> {
        (self.lookup)(s.name)
    }

    /// The value, when it is set and not blank.
    pub fn text(&self, s: &Setting) -> Option<String> {
        self.raw(s).filter(|v| !v.trim().is_empty())
    }

    /// The setting's number (a byte count for [`Value::Bytes`]) within its bounds; `None` when
    /// unset or blank.
    ///
    /// # Errors
    /// As [`Setting::number`].
    pub fn number<T: TryFrom<u64>>(&self, s: &Setting) -> Result<Option<T>> {
        self.text(s).map(|v| s.number(&v)).transpose()
    }

    /// The setting's number, or its definition's value when unset.
    ///
    /// # Errors
    /// As [`Setting::number`].
    pub fn number_or_initial<T: TryFrom<u64>>(&self, s: &Setting) -> Result<T> {
        Ok(match self.number(s)? {
            Some(n) => n,
            None => s.initial(),
        })
    }

    /// A switch: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable for any other value.
    pub fn flag(&self, s: &Setting) -> Result<Option<bool>> {
        self.text(s).map(|v| flag(s.name, &v)).transpose()
    }

    /// The switch, or its definition's state when unset.
    ///
    /// # Errors
    /// As [`flag`](Self::flag).
    pub fn flag_or_initial(&self, s: &Setting) -> Result<bool> {
        Ok(self.flag(s)?.unwrap_or(s.on_by_default()))
    }

    /// A value `parse` understands; its `Err` is the reason the value is refused.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable, with `parse`'s reason.
    pub fn parsed<T>(
        &self,
        s: &Setting,
        parse: impl FnOnce(&str) -> std::result::Result<T, String>,
    ) -> Result<Option<T>> {
        self.text(s)
            .map(|v| parse(v.trim()).map_err(|reason| invalid(s.name, &v, reason)))
            .transpose()
    }
}

/// Variable `name` of this process's environment: the one lookup every crate's `from_env`
/// reads through. A value that is not UTF-8 comes back with its bad bytes replaced, so its
/// reader refuses it by name instead of taking it for unset.
pub fn process(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// A lookup over `vars`, (name, value) pairs: settings given as a list (tests, a file's keys).
pub fn table<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    }
}

/// The refusal of `value` for variable `name`.
pub fn invalid(name: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// `value` as a number in `min..=max`.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `name`.
pub fn number_in<T>(name: &str, value: &str, min: T, max: T) -> Result<T>
where
    T: FromStr + PartialOrd + Copy + std::fmt::Display,
{
    let parsed: T = value
        .trim()
        .parse()
        .map_err(|_| invalid(name, value, "not a number"))?;
    if parsed < min || parsed > max {
        return Err(invalid(
            name,
            value,
            format!("must be between {min} and {max}"),
        ));
    }
    Ok(parsed)
}

/// `value` as a switch (an empty value is off).
///
/// # Errors
/// [`Error::InvalidConfig`] naming `name`.
pub fn flag(name: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(invalid(name, value, "expected 0/1/true/false")),
    }
}

/// `value` as a byte count (`K`, `M`, `G`, `T` suffixes), 1 byte to 64 PiB.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `name`.
pub fn size(name: &str, value: &str) -> Result<u64> {
    let v = value.trim();
    let (digits, shift) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(invalid(name, value, "suffix must be K, M, G or T")),
            };
            (&v[..i], shift)
        }
        _ => (v, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| invalid(name, value, "not a byte count"))?;
    match n.checked_shl(shift).filter(|b| *b >> shift == n) {
        Some(b) if (1..=1u64 << 56).contains(&b) => Ok(b),
        _ => Err(invalid(name, value, "must be 1 byte to 64 PiB")),
    }
}

/// `value` as a byte count ([`size`]) between `min` and `max`.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `name`.
pub fn size_in(name: &str, value: &str, min: u64, max: u64) -> Result<usize> {
    let bytes = size(name, value)?;
    if bytes < min || bytes > max {
        return Err(invalid(
            name,
            value,
            format!("must be between {min} and {max} bytes"),
        ));
    }
    usize::try_from(bytes).map_err(|_| invalid(name, value, "too large for this machine"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANES: Setting = Setting {
        name: "TE_TEST_LANES",
        value: Value::Number {
            unset: Unset::Is(4),
            min: 1,
            max: 64,
        },
        doc: "lanes",
    };
    const QUEUE: Setting = Setting {
        name: "TE_TEST_QUEUE",
        value: Value::Bytes {
            unset: Unset::Means("the host's"),
            min: 64 << 10,
            max: 1 << 40,
        },
        doc: "queue",
    };

    #[test]
    fn values_are_read_through_their_setting_and_refusals_name_it() {
        let lookup = table(&[("TE_TEST_LANES", " 8 "), ("TE_TEST_QUEUE", "2M")]);
        let env = Env::new(&lookup);
        assert_eq!(env.number::<u32>(&LANES).unwrap(), Some(8));
        assert_eq!(env.number::<u64>(&QUEUE).unwrap(), Some(2 << 20));
        let lookup = table(&[("TE_TEST_LANES", "99"), ("TE_TEST_QUEUE", "4K")]);
        for refused in [
            Env::new(&lookup).number::<u32>(&LANES),
            Env::new(&lookup).number::<u32>(&QUEUE),
        ] {
            match refused {
                Err(Error::InvalidConfig { name, reason, .. }) => {
                    assert!(name.starts_with("TE_TEST_"), "{name}");
                    assert!(
                        reason.contains("between 1 and 64")
                            || reason.contains("between 64 KiB and 1 TiB"),
                        "{reason}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        let big = table(&[("TE_TEST_QUEUE", "1T")]);
        assert!(
            Env::new(&big).number::<u8>(&QUEUE).is_err(),
            "too large for u8"
        );
        let unset = |_: &str| None;
        assert_eq!(Env::new(&unset).flag(&LANES).unwrap(), None);
        assert_eq!(
            Env::new(&unset).number_or_initial::<u32>(&LANES).unwrap(),
            4
        );
        assert!(flag("X", "maybe").is_err());
        assert_eq!(size("X", "2M").unwrap(), 2 << 20);
        assert!(size("X", "0").is_err());
    }

    #[test]
    fn the_docs_say_what_the_definition_does() {
        assert_eq!(
            (LANES.default_text().as_str(), LANES.values_text().as_str()),
            ("4", "1–64")
        );
        assert_eq!(QUEUE.default_text(), "the host's");
        assert_eq!(QUEUE.values_text(), "64 KiB–1 TiB (K/M/G/T suffixes)");
        assert_eq!(bytes_text(4097), "4097 B");
        assert_eq!(bytes_text(128 << 20), "128 MiB");
    }
}

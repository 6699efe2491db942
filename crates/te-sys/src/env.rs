//! Settings from the environment. Each variable is defined once, as a [`Setting`], by the crate
//! that reads it (its `settings.rs`), and read through an [`Env`], which names the variable in
//! every refusal. `cargo xtask config` writes `docs/configuration.md` from those definitions.

use std::str::FromStr;

use crate::error::{Error, Result};

/// One environment variable: its name, its default and range as a user reads them, and what it
/// does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The variable, `MC_…`.
    pub name: &'static str,
    /// The default, in words (`4`, `off`, `the host's`).
    pub default: &'static str,
    /// The values taken (`1–64`, `0/1`, `a path`).
    pub range: &'static str,
    /// What it does, in a sentence or two.
    pub doc: &'static str,
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

    /// A number in `min..=max`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable: not a number, or out of range.
    pub fn number<T>(&self, s: &Setting, min: T, max: T) -> Result<Option<T>>
    where
        T: FromStr + PartialOrd + Copy + std::fmt::Display,
    {
        self.text(s)
            .map(|v| number_in(s.name, &v, min, max))
            .transpose()
    }

    /// A switch: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable for any other value.
    pub fn flag(&self, s: &Setting) -> Result<Option<bool>> {
        self.text(s).map(|v| flag(s.name, &v)).transpose()
    }

    /// A byte count with an optional `K`, `M`, `G` or `T` suffix, 1 byte to 64 PiB.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the variable.
    pub fn size(&self, s: &Setting) -> Result<Option<u64>> {
        self.text(s).map(|v| size(s.name, &v)).transpose()
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
        default: "4",
        range: "1–64",
        doc: "lanes",
    };

    #[test]
    fn values_are_read_through_their_setting_and_refusals_name_it() {
        let lookup = table(&[("TE_TEST_LANES", " 8 ")]);
        let env = Env::new(&lookup);
        assert_eq!(env.number(&LANES, 1u32, 64).unwrap(), Some(8));
        let lookup = table(&[("TE_TEST_LANES", "99")]);
        match Env::new(&lookup).number(&LANES, 1u32, 64) {
            Err(Error::InvalidConfig { name, reason, .. }) => {
                assert_eq!(name, "TE_TEST_LANES");
                assert!(reason.contains("between 1 and 64"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let unset = |_: &str| None;
        assert_eq!(Env::new(&unset).flag(&LANES).unwrap(), None);
        assert!(flag("X", "maybe").is_err());
        assert_eq!(size("X", "2M").unwrap(), 2 << 20);
        assert!(size("X", "0").is_err());
    }
}

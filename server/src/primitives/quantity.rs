//! Kubernetes resource quantities (`3920m`, `15Gi`, `14848Mi`, `110`,
//! `1e3`) read into one exact number, so a Node's allocatable can be
//! compared with what Karpenter wrote on its NodeClaim; and the
//! [`Resource`]s so compared, which the Node cache keeps of a Node's
//! allocatable.
//!
//! k8s-openapi carries a quantity as the string the API server sent and
//! nothing in our dependencies parses it, so this does, by the API
//! server's grammar: an optional sign, digits with an optional decimal
//! point, then one suffix: binary (`Ki` … `Ei`), decimal (`n`, `u`, `m`,
//! none, `k`, `M` … `E`) or a decimal exponent (`e3`, `E-2`). The value is
//! kept in thousandths of the unit (millicores for cpu, millibytes for
//! memory), exactly, rounded up where a quantity is finer than that, as
//! the API server's own `MilliValue` does. Anything else is an error that
//! names the text: the value comes from a node's own status.

use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Longest quantity read. The API server's canonical forms are under 20
/// characters; a node writes its own status, so a longer one is refused
/// rather than parsed.
pub const MAX_LEN: usize = 64;

/// A quantity, in thousandths of its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    milli: i128,
}

/// Why a text is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("quantity of {0} characters (at most {MAX_LEN} are read)")]
    TooLong(usize),
    #[error("quantity {0:?}: no number")]
    NoNumber(String),
    #[error("quantity {0:?}: unknown suffix")]
    Suffix(String),
    #[error("quantity {0:?}: too large")]
    TooLarge(String),
}

impl Quantity {
    /// A quantity of `milli` thousandths.
    pub const fn from_milli(milli: i128) -> Self {
        Quantity { milli }
    }

    /// Its value in thousandths of the unit.
    pub const fn milli(self) -> i128 {
        self.milli
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text)
    }
}

impl fmt::Display for Quantity {
    /// In thousandths (`3920m`), or whole units when it is whole.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli % 1000 == 0 {
            write!(f, "{}", self.milli / 1000)
        } else {
            write!(f, "{}m", self.milli)
        }
    }
}

/// A suffix's scale: `value = number × 1024^binary × 10^decimal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scale {
    binary: u32,
    decimal: i32,
}

/// Reads `text` as a Kubernetes quantity.
pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Empty);
    }
    if text.len() > MAX_LEN {
        return Err(QuantityError::TooLong(text.len()));
    }
    let (negative, unsigned) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (digits, fraction_digits) =
        digits(number).ok_or_else(|| QuantityError::NoNumber(text.to_string()))?;
    let scale = scale(suffix).ok_or_else(|| QuantityError::Suffix(text.to_string()))?;
    let too_large = || QuantityError::TooLarge(text.to_string());
    let magnitude = scaled(&digits, fraction_digits, scale).ok_or_else(too_large)?;
    let milli = i128::try_from(magnitude).map_err(|_| too_large())?;
    Ok(Quantity {
        milli: if negative { -milli } else { milli },
    })
}

/// The digits of `number` (without the point) and how many follow the
/// point; `None` unless there is at least one digit and at most one point.
fn digits(number: &str) -> Option<(String, u32)> {
    let mut parts = number.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next().unwrap_or_default();
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return None;
    }
    let fraction_digits = u32::try_from(fraction.len()).ok()?;
    Some((format!("{whole}{fraction}"), fraction_digits))
}

/// The scale a suffix stands for, or `None` for an unknown one.
fn scale(suffix: &str) -> Option<Scale> {
    let decimal = |decimal| Some(Scale { binary: 0, decimal });
    let binary = |binary| Some(Scale { binary, decimal: 0 });
    match suffix {
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "" => decimal(0),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => exponent(suffix).and_then(decimal),
    }
}

/// The exponent of a decimal-exponent suffix (`e3`, `E-2`, `e+6`).
fn exponent(suffix: &str) -> Option<i32> {
    let rest = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    let unsigned = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

/// `digits × 10^-fraction_digits × scale`, in thousandths, rounded up;
/// `None` when it does not fit.
fn scaled(digits: &str, fraction_digits: u32, scale: Scale) -> Option<u128> {
    let mut value: u128 = digits.parse().ok()?;
    value = value.checked_mul(1024u128.checked_pow(scale.binary)?)?;
    // Thousandths: three more decimal places.
    let exponent = i64::from(scale.decimal) + 3 - i64::from(fraction_digits);
    if exponent >= 0 {
        let power = 10u128.checked_pow(u32::try_from(exponent).ok()?)?;
        return value.checked_mul(power);
    }
    let divisor = u32::try_from(-exponent)
        .ok()
        .and_then(|e| 10u128.checked_pow(e));
    Some(match divisor {
        Some(divisor) => value.div_ceil(divisor),
        // Finer than any u128 can divide: a sliver, rounded up.
        None => u128::from(value > 0),
    })
}

/// The resources compared: those Karpenter bin-packs with that a
/// class's `spec.kubelet` changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Memory,
    Pods,
    EphemeralStorage,
}

impl Resource {
    /// Every resource compared, in the order they are reported.
    pub const ALL: [Resource; 4] = [
        Resource::Cpu,
        Resource::Memory,
        Resource::Pods,
        Resource::EphemeralStorage,
    ];

    /// Its name in `status.allocatable` (and the metric's label).
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Pods => "pods",
            Resource::EphemeralStorage => "ephemeral-storage",
        }
    }

    /// The `spec.kubelet` fields that decide it, as the operator is told.
    pub fn fields(self) -> &'static str {
        match self {
            Resource::Cpu => "spec.kubelet.kubeReserved/systemReserved cpu",
            Resource::Memory => {
                "spec.kubelet.kubeReserved/systemReserved memory and evictionHard memory.available"
            }
            Resource::Pods => "spec.kubelet.maxPods (or podsPerCore)",
            Resource::EphemeralStorage => {
                "spec.kubelet.evictionHard nodefs.available and kubeReserved/systemReserved ephemeral-storage"
            }
        }
    }

    /// `milli` thousandths of it, as an operator reads them.
    pub fn amount(self, milli: i128) -> String {
        match self {
            Resource::Cpu => format!("{milli}m"),
            Resource::Pods => (milli / 1000).to_string(),
            Resource::Memory | Resource::EphemeralStorage => {
                let bytes = milli / 1000;
                const MIB: i128 = 1 << 20;
                if bytes.abs() >= MIB {
                    format!("{}Mi", (bytes + MIB / 2) / MIB)
                } else {
                    format!("{bytes} bytes")
                }
            }
        }
    }
}

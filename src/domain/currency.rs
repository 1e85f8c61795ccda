use super::InvalidField;

/// An ISO 4217 currency the provider accepts, stored lowercase as Stripe writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency(&'static str);

/// Stripe's presentment currencies.
const SUPPORTED: &[&str] = &[
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bhd", "bif", "bmd", "bnd", "bob", "brl", "bsd", "bwp", "byn", "bzd", "cad", "cdf",
    "chf", "clp", "cny", "cop", "crc", "cve", "czk", "djf", "dkk", "dop", "dzd", "egp", "etb",
    "eur", "fjd", "fkp", "gbp", "gel", "gip", "gmd", "gnf", "gtq", "gyd", "hkd", "hnl", "htg",
    "huf", "idr", "ils", "inr", "isk", "jmd", "jod", "jpy", "kes", "kgs", "khr", "kmf", "krw",
    "kwd", "kyd", "kzt", "lak", "lbp", "lkr", "lrd", "lsl", "mad", "mdl", "mga", "mkd", "mmk",
    "mnt", "mop", "mur", "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr",
    "nzd", "omr", "pab", "pen", "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub",
    "rwf", "sar", "sbd", "scr", "sek", "sgd", "shp", "sle", "sos", "srd", "std", "szl", "thb",
    "tjs", "tnd", "top", "try", "ttd", "twd", "tzs", "uah", "ugx", "usd", "uyu", "uzs", "vnd",
    "vuv", "wst", "xaf", "xcd", "xof", "xpf", "yer", "zar", "zmw",
];

/// Currencies whose minor unit is the major unit (an amount of 500 JPY is sent as 500).
const ZERO_DECIMAL: &[&str] = &[
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];

const THREE_DECIMAL: &[&str] = &["bhd", "jod", "kwd", "omr", "tnd"];

impl Currency {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return Err(InvalidField::new("currency", "is required"));
        }
        // Every call and every stored row parses its currency, so no allocation and no scan:
        // each code is three ASCII letters, and SUPPORTED is sorted (a test holds it so).
        let mut lowercase = [0_u8; 3];
        if trimmed.len() == lowercase.len() {
            for (out, byte) in lowercase.iter_mut().zip(trimmed.bytes()) {
                *out = byte.to_ascii_lowercase();
            }
        }
        SUPPORTED
            .binary_search_by(|code| code.as_bytes().cmp(&lowercase[..]))
            .map(|index| Currency(SUPPORTED[index]))
            .map_err(|_| {
                InvalidField::new(
                    "currency",
                    format!("{value:?} is not an ISO 4217 currency the provider supports"),
                )
            })
    }

    pub fn code(self) -> &'static str {
        self.0
    }

    /// Digits after the decimal point of the major unit: 2 for usd, 0 for jpy, 3 for kwd.
    pub fn exponent(self) -> u32 {
        if ZERO_DECIMAL.contains(&self.0) {
            0
        } else if THREE_DECIMAL.contains(&self.0) {
            3
        } else {
            2
        }
    }

    /// Formats a minor-unit amount in major units, e.g. 1050 usd → "10.50".
    pub fn format_major(self, amount_minor: i64) -> String {
        let exponent = self.exponent();
        if exponent == 0 {
            return amount_minor.to_string();
        }
        let scale = 10_i64.pow(exponent);
        let sign = if amount_minor < 0 { "-" } else { "" };
        let magnitude = amount_minor.unsigned_abs();
        let scale = scale.unsigned_abs();
        format!(
            "{sign}{}.{:0width$}",
            magnitude / scale,
            magnitude % scale,
            width = exponent as usize
        )
    }
}

impl std::fmt::Display for Currency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_case_insensitively() {
        assert_eq!(Currency::parse("EUR").unwrap().code(), "eur");
        assert_eq!(Currency::parse("usd").unwrap().code(), "usd");
    }

    #[test]
    fn every_supported_code_parses_to_itself_in_any_case() {
        assert!(
            SUPPORTED.windows(2).all(|pair| pair[0] < pair[1]),
            "SUPPORTED must stay sorted and unique: parse searches it by halves"
        );
        for code in SUPPORTED {
            assert_eq!(Currency::parse(code).unwrap().code(), *code);
            assert_eq!(
                Currency::parse(&code.to_ascii_uppercase()).unwrap().code(),
                *code
            );
            assert_eq!(Currency::parse(&format!(" {code} ")).unwrap().code(), *code);
        }
    }

    #[test]
    fn rejects_unknown_codes() {
        assert_eq!(Currency::parse("xyz").unwrap_err().field, "currency");
        assert!(Currency::parse("").is_err());
        assert!(Currency::parse("dollars").is_err());
        assert!(Currency::parse("us").is_err());
        assert!(Currency::parse("usdx").is_err());
        assert!(Currency::parse("u\u{e9}d").is_err());
    }

    #[test]
    fn formats_major_units_by_exponent() {
        assert_eq!(Currency::parse("usd").unwrap().format_major(1050), "10.50");
        assert_eq!(Currency::parse("usd").unwrap().format_major(-5), "-0.05");
        assert_eq!(Currency::parse("jpy").unwrap().format_major(500), "500");
        assert_eq!(Currency::parse("kwd").unwrap().format_major(1234), "1.234");
    }
}

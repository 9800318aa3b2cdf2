//! Status, kind and reason enums stored as their column values (`'PENDING'`, `'NO_LIQUIDITY'`):
//! [`column_enum!`] gives each one the same derives — parsed from and written as its
//! SCREAMING_SNAKE_CASE text by strum (`FromStr`, `Display`, `&'static str`), the same text in
//! JSON by serde — instead of the same ten-line derive block on every enum; and [`parse`],
//! which reads one back, a value this code does not know being an error naming the row
//! ([`UnknownValue`]), never a panic.

/// Declares an enum whose variants are stored as SCREAMING_SNAKE_CASE text.
///
/// ```
/// paybus_db::column_enum! {
///     /// `widgets.status`.
///     pub enum WidgetStatus {
///         /// Waiting.
///         Pending,
///         NoLongerNeeded,
///     }
/// }
/// assert_eq!(WidgetStatus::NoLongerNeeded.to_string(), "NO_LONGER_NEEDED");
/// assert_eq!("PENDING".parse::<WidgetStatus>(), Ok(WidgetStatus::Pending));
/// ```
///
/// More derives or strum / serde options go on the enum as usual (`#[derive(Default)]`,
/// `#[strum(ascii_case_insensitive)]`). Text in another case names it first:
/// `column_enum! { case = "lowercase"; pub enum Container { Pg, Aos } }`.
#[macro_export]
macro_rules! column_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($body:tt)* }) => {
        $crate::column_enum! {
            case = "SCREAMING_SNAKE_CASE";
            $(#[$meta])* $vis enum $name { $($body)* }
        }
    };
    (case = $case:tt; $(#[$meta:meta])* $vis:vis enum $name:ident { $($body:tt)* }) => {
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            $crate::__private::serde::Serialize,
            $crate::__private::serde::Deserialize,
            $crate::__private::strum::Display,
            $crate::__private::strum::EnumString,
            $crate::__private::strum::IntoStaticStr,
        )]
        #[serde(crate = "paybus_db::__private::serde", rename_all = $case)]
        #[strum(crate = "paybus_db::__private::strum", serialize_all = $case)]
        $(#[$meta])*
        $vis enum $name { $($body)* }
    };
}

/// A column holds a value this code does not know: a row written by something else (a manual
/// edit, a newer release). Names the row, so ops can find it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entity} {id} has {column} {value:?}, which this code does not know")]
pub struct UnknownValue {
    pub entity: &'static str,
    pub id: u64,
    pub column: &'static str,
    pub value: String,
}

/// A status-like column read back into its enum.
pub fn parse<T: std::str::FromStr>(
    entity: &'static str,
    id: u64,
    column: &'static str,
    value: String,
) -> Result<T, UnknownValue> {
    value.parse().map_err(|_| UnknownValue {
        entity,
        id,
        column,
        value,
    })
}

//! Reading and writing AMQP message headers as RabbitMQ (and Amazon MQ's Lambda event)
//! carries them.

use lapin::types::{AMQPValue, FieldTable, ShortString};

/// An integer header, whichever integer width the sender chose.
pub fn header_integer(headers: Option<&FieldTable>, name: &str) -> Option<i64> {
    match headers?.inner().get(name)? {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

/// A string header (long or short string).
pub fn header_text(headers: Option<&FieldTable>, name: &str) -> Option<String> {
    match headers?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// A string header as RabbitMQ accepts it (it rejects short strings in tables).
pub fn text_header(headers: &mut FieldTable, name: &str, value: &str) {
    headers.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
}

pub fn integer_header(headers: &mut FieldTable, name: &str, value: i64) {
    headers.insert(ShortString::from(name), AMQPValue::LongLongInt(value));
}

//! Reading and writing AMQP message headers as RabbitMQ (and Amazon MQ's Lambda event)
//! carries them.

use lapin::types::{AMQPValue, FieldTable, ShortString};
use serde_json::{Map, Value, json};

use paybus_telemetry::{
    TraceHeaders,
    propagation::{TRACEPARENT, TRACESTATE},
};

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

/// Headers as readable JSON for the `dead_letters.headers` column: strings as strings,
/// numbers as numbers, tables as objects, so ops query them with plain SQL
/// (`headers->>'$."x-paybus-reason"'`). (lapin's own serde form spells a string as its bytes.)
pub fn to_json(table: &FieldTable) -> Value {
    Value::Object(
        table
            .inner()
            .iter()
            .map(|(name, value)| (name.to_string(), value_to_json(value)))
            .collect::<Map<_, _>>(),
    )
}

fn value_to_json(value: &AMQPValue) -> Value {
    match value {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::ShortShortInt(n) => json!(n),
        AMQPValue::ShortShortUInt(n) => json!(n),
        AMQPValue::ShortInt(n) => json!(n),
        AMQPValue::ShortUInt(n) => json!(n),
        AMQPValue::LongInt(n) => json!(n),
        AMQPValue::LongUInt(n) => json!(n),
        AMQPValue::LongLongInt(n) => json!(n),
        AMQPValue::Float(f) => json!(f),
        AMQPValue::Double(f) => json!(f),
        AMQPValue::DecimalValue(d) => {
            json!(format!("{}e-{}", d.value, d.scale))
        }
        AMQPValue::ShortString(s) => json!(s.as_str()),
        AMQPValue::LongString(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::FieldArray(values) => {
            Value::Array(values.as_slice().iter().map(value_to_json).collect())
        }
        AMQPValue::Timestamp(t) => json!(t),
        AMQPValue::FieldTable(table) => to_json(table),
        AMQPValue::ByteArray(bytes) => json!(hex::encode(bytes.as_slice())),
        AMQPValue::Void => Value::Null,
    }
}

/// The header a Lambda delivery carries its invocation's X-Ray trace id in (X-Ray's own HTTP
/// header name).
pub const XRAY_TRACE_HEADER: &str = "x-amzn-trace-id";

/// A message's trace context (W3C `traceparent` / `tracestate`) from its AMQP headers.
pub fn trace_headers(headers: Option<&FieldTable>) -> TraceHeaders {
    TraceHeaders {
        traceparent: header_text(headers, TRACEPARENT),
        tracestate: header_text(headers, TRACESTATE),
    }
}

/// Writes `trace` into an outgoing message's AMQP headers.
pub fn set_trace_headers(headers: &mut FieldTable, trace: &TraceHeaders) {
    if let Some(traceparent) = &trace.traceparent {
        text_header(headers, TRACEPARENT, traceparent);
    }
    if let Some(tracestate) = &trace.tracestate {
        text_header(headers, TRACESTATE, tracestate);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_trace_headers_round_trip_through_amqp() {
        let headers = TraceHeaders {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("a=b".into()),
        };
        let mut table = FieldTable::default();
        set_trace_headers(&mut table, &headers);
        assert_eq!(trace_headers(Some(&table)), headers);
        assert!(trace_headers(None).is_empty());
    }

    use super::*;

    #[test]
    fn headers_read_as_plain_json() {
        let mut death = FieldTable::default();
        text_header(&mut death, "reason", "delivery_limit");
        integer_header(&mut death, "count", 20);
        let mut headers = FieldTable::default();
        text_header(&mut headers, "x-paybus-reason", "failed");
        integer_header(&mut headers, "x-paybus-attempts", 3);
        headers.insert(
            ShortString::from("x-death"),
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
        );
        headers.insert(ShortString::from("x-flag"), AMQPValue::Boolean(true));

        assert_eq!(
            to_json(&headers),
            json!({
                "x-paybus-reason": "failed",
                "x-paybus-attempts": 3,
                "x-death": [{"reason": "delivery_limit", "count": 20}],
                "x-flag": true,
            })
        );
    }
}

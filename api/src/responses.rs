//! The answers the OpenAPI document shares between routes: the error body, the created-row
//! body and the error sets of admin and signed routes. Route modules name them in their
//! `#[utoipa::path]` annotations; `crate::openapi` assembles the document from the modules.

use std::collections::BTreeMap;

use utoipa::{
    IntoResponses, PartialSchema, ToSchema,
    openapi::{
        ContentBuilder, ObjectBuilder, RefOr, ResponseBuilder, Type, response::Response,
        schema::Schema,
    },
};

/// The body of every error answer.
pub(crate) struct ErrorBody;

impl PartialSchema for ErrorBody {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property(
                "error",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("What is wrong, for people")),
            )
            .required("error")
            .into()
    }
}

impl ToSchema for ErrorBody {}

/// `{"id": N}`: the row a POST created.
pub(crate) struct Created;

impl PartialSchema for Created {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property("id", ObjectBuilder::new().schema_type(Type::Integer))
            .required("id")
            .into()
    }
}

impl ToSchema for Created {}

fn error_responses(answers: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    answers
        .iter()
        .map(|(status, description)| {
            let response = ResponseBuilder::new()
                .description(*description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(ErrorBody::schema()))
                        .build(),
                )
                .build();
            (status.to_string(), response.into())
        })
        .collect()
}

/// What any admin route may answer besides its success.
pub(crate) struct AdminErrors;

impl IntoResponses for AdminErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[
            (
                400,
                "Malformed JSON, a missing, unknown or ill-typed field, a bad path value",
            ),
            (401, "Missing, malformed, tampered or expired token"),
            (
                403,
                "The token lacks the role (GET needs OPS, anything else ADMIN)",
            ),
            (404, "No such row"),
            (408, "The body did not arrive in time"),
            (409, "Conflicts with the row's current state"),
            (413, "Body larger than 64 KiB"),
            (
                503,
                "The database is unavailable, or PAYBUS_ADMIN_JWT_SECRET is unset",
            ),
        ])
    }
}

/// What any partner route may answer besides its success.
pub(crate) struct PartnerErrors;

impl IntoResponses for PartnerErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[
            (
                400,
                "Malformed JSON, a missing, unknown or ill-typed field, a bad path value or \
                 Idempotency-Key",
            ),
            (
                401,
                "Missing, malformed, unknown, revoked or expired API key",
            ),
            (404, "No such row of this partner's"),
            (408, "The body did not arrive in time"),
            (
                409,
                "Conflicts with the row's current state, or a request with this Idempotency-Key \
                 is still running (Retry-After)",
            ),
            (413, "Body larger than 64 KiB"),
            (422, "The Idempotency-Key was used with another request"),
            (
                429,
                "Past the partner's rate limit (Retry-After, RateLimit headers)",
            ),
            (
                503,
                "The database is unavailable, or PAYBUS_PARTNER_KEY_HASH_KEY is unset",
            ),
        ])
    }
}

/// What a signed route (chain monitor, payment service) may answer besides its success.
pub(crate) struct SignedErrors;

impl IntoResponses for SignedErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[
            (400, "Malformed JSON, a missing, unknown or ill-typed field"),
            (401, "Missing, malformed, stale (±300 s) or wrong signature"),
            (404, "Unknown gateway or charge"),
            (408, "The body did not arrive in time"),
            (409, "Conflicts with the charge's current state"),
            (413, "Body larger than 64 KiB"),
            (
                503,
                "The database is unavailable, or the route's secret is unset",
            ),
        ])
    }
}

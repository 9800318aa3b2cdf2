//! What every admin route shares besides its role check (`auth`): path ids.

use axum::extract::{Path, rejection::PathRejection};

use crate::ApiError;

/// A `{id}` path segment: a positive integer, else 400.
pub(crate) fn path_id(path: Result<Path<u64>, PathRejection>) -> Result<u64, ApiError> {
    match path {
        Ok(Path(id)) if id > 0 => Ok(id),
        _ => Err(ApiError::BadRequest(
            "the id in the path must be a positive integer".to_owned(),
        )),
    }
}

/// Two `{id}` path segments (a row and one of its own): positive integers, else 400.
pub(crate) fn path_ids(
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Result<(u64, u64), ApiError> {
    match path {
        Ok(Path((first, second))) if first > 0 && second > 0 => Ok((first, second)),
        _ => Err(ApiError::BadRequest(
            "the ids in the path must be positive integers".to_owned(),
        )),
    }
}

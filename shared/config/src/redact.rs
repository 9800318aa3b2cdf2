//! Credentials never reach a log line or an error message.

use url::Url;

/// The URL with its password replaced by `***`.
pub fn url(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Only fails for URLs that cannot have credentials, which then have none to hide.
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// Best effort for a string that may not even parse as a URL: hide `user:password@`.
pub fn text(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(parsed) => url(&parsed),
        Err(_) => match (raw.find("://"), raw.rfind('@')) {
            (Some(scheme_end), Some(at)) if at > scheme_end => {
                format!("{}://***@{}", &raw[..scheme_end], &raw[at + 1..])
            }
            _ => raw.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hides_passwords() {
        let u = url::Url::parse("mysql://app:pw@db:3306/x").unwrap();
        assert_eq!(super::url(&u), "mysql://app:***@db:3306/x");
        assert_eq!(super::text("amqp://u:p@h:port/x"), "amqp://***@h:port/x");
        assert_eq!(super::text("not a url"), "not a url");
    }
}

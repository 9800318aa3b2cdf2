//! The suite's OpenID Connect provider (`paybus_testkit::oidc`): panva's
//! oidc-provider on Node, driven as the API's, the console's and the command line's tests
//! drive it. Its tokens are checked as a resource server checks them: the JWKS key of the
//! token's `kid`, RS256, the issuer and the audience.
//!
//! Skipped with a message when `infra/oidc/install.sh` has not run, unless
//! `PAYBUS_REQUIRE_OIDC_TESTS` is set (infra/test.sh sets it): then they fail.

use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use paybus_testkit::oidc::{
    ADMINS_GROUP, CLI_CLIENT_ID, CONSOLE_CLIENT_ID, OPS_GROUP, OidcProvider, OidcSetup,
    STAFF_GROUP, unverified_claims,
};
use serde_json::{Value, json};

/// The token's claims if a resource server trusting `oidc` accepts it, else why not.
async fn verify(oidc: &OidcProvider, token: &str) -> Result<Value, String> {
    let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
    let kid = header.kid.ok_or("no kid")?;
    let jwks: JwkSet = serde_json::from_value(oidc.jwks().await).expect("a JWKS");
    let jwk = jwks
        .find(&kid)
        .ok_or_else(|| format!("no key {kid} in the JWKS"))?;
    let key = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_issuer(&[oidc.issuer()]);
    validation.set_audience(&[oidc.audience()]);
    jsonwebtoken::decode::<Value>(token, &key, &validation)
        .map(|data| data.claims)
        .map_err(|e| e.to_string())
}

async fn published_kids(oidc: &OidcProvider) -> Vec<String> {
    oidc.jwks().await["keys"]
        .as_array()
        .expect("the JWKS has keys")
        .iter()
        .map(|key| key["kid"].as_str().expect("each key has a kid").to_owned())
        .collect()
}

fn kid_of(token: &str) -> String {
    jsonwebtoken::decode_header(token)
        .expect("a JWT header")
        .kid
        .expect("a kid")
}

#[tokio::test]
async fn discovery_describes_the_provider_the_clients_use() {
    let Some(oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };

    let discovery = oidc.discovery().await;

    assert_eq!(discovery["issuer"], json!(oidc.issuer()));
    for endpoint in [
        "authorization_endpoint",
        "token_endpoint",
        "device_authorization_endpoint",
        "jwks_uri",
        "revocation_endpoint",
        "end_session_endpoint",
    ] {
        let url = discovery[endpoint].as_str().unwrap_or_default();
        assert!(url.starts_with(&oidc.issuer()), "{endpoint}: {discovery}");
    }
    assert_eq!(
        discovery["code_challenge_methods_supported"],
        json!(["S256"])
    );
    assert_eq!(discovery["response_types_supported"], json!(["code"]));
    for scope in ["openid", "offline_access", "email", "profile", "groups"] {
        assert!(
            discovery["scopes_supported"]
                .as_array()
                .is_some_and(|s| s.contains(&json!(scope))),
            "{scope}: {discovery}"
        );
    }
    assert_eq!(published_kids(&oidc).await, [oidc.kid()]);
}

#[tokio::test]
async fn a_device_login_gives_a_jwt_access_token_for_the_api_with_the_users_groups() {
    let Some(oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };

    let alice = oidc.device_login("alice").await;

    assert_eq!(kid_of(&alice.access_token), oidc.kid());
    let claims = verify(&oidc, &alice.access_token)
        .await
        .unwrap_or_else(|e| panic!("alice's access token: {e}"));
    assert_eq!(claims["iss"], json!(oidc.issuer()));
    assert_eq!(claims["aud"], json!(oidc.audience()));
    assert_eq!(claims["sub"], "alice");
    assert_eq!(claims["groups"], json!([ADMINS_GROUP]));
    assert_eq!(claims["preferred_username"], "alice");
    assert_eq!(claims["email"], "alice@example.com");
    assert_eq!(claims["client_id"], CLI_CLIENT_ID);
    assert!(
        alice.refresh_token.is_some(),
        "offline_access gives a refresh token"
    );
    let id_token = unverified_claims(alice.id_token.as_deref().expect("an ID token"));
    assert_eq!(id_token["aud"], CLI_CLIENT_ID);
    assert_eq!(id_token["sub"], "alice");

    for (user, group) in [("carol", STAFF_GROUP), ("dave", OPS_GROUP)] {
        let tokens = oidc.device_login(user).await;
        let claims = verify(&oidc, &tokens.access_token)
            .await
            .unwrap_or_else(|e| panic!("{user}'s access token: {e}"));
        assert_eq!(
            (&claims["sub"], &claims["groups"]),
            (&json!(user), &json!([group]))
        );
    }
}

#[tokio::test]
async fn a_login_that_is_no_configured_user_is_refused() {
    let Some(oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };
    let authorization = oidc.start_device_authorization().await;

    let approval = oidc
        .approve_device_code(&authorization.verification_uri_complete, "mallory")
        .await;

    let refused = approval.expect_err("mallory is nobody the provider knows");
    assert!(refused.text.contains("interrupted"), "{refused}");
    let polled = oidc.device_token(&authorization).await;
    let error = polled.expect_err("the command line gets no token for mallory");
    assert_eq!(error.error, "access_denied", "{error}");
    assert_eq!(
        error.error_description.as_deref(),
        Some("no such user: mallory")
    );
}

#[tokio::test]
async fn tokens_the_harness_signs_verify_as_the_providers_do_and_its_forgeries_do_not() {
    let Some(oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };

    let signed = oidc.sign(oidc.claims_for("bob"));
    let claims = verify(&oidc, &signed)
        .await
        .expect("signed by the published key");
    assert_eq!(
        (&claims["sub"], &claims["groups"]),
        (&json!("bob"), &json!([ADMINS_GROUP]))
    );

    let mut expired = oidc.claims_for("bob");
    expired["exp"] = json!(expired["iat"].as_u64().unwrap_or_default() - 3600);
    let refused = verify(&oidc, &oidc.sign(expired)).await;
    assert!(refused.is_err_and(|e| e.contains("Expired")));

    let mut elsewhere = oidc.claims_for("bob");
    elsewhere["aud"] = json!("urn:someone-else");
    assert!(
        verify(&oidc, &oidc.sign(elsewhere))
            .await
            .is_err_and(|e| e.contains("Audience"))
    );

    let unknown = oidc.sign_with_unknown_key(oidc.claims_for("bob"));
    assert!(!published_kids(&oidc).await.contains(&kid_of(&unknown)));
    assert!(
        verify(&oidc, &unknown)
            .await
            .is_err_and(|e| e.contains("no key"))
    );

    // The confusion attack works on a verifier that keys HMAC with the PEM it was given.
    let confused = oidc.sign_hs256_with_public_key(oidc.claims_for("bob"));
    let header = jsonwebtoken::decode_header(&confused).expect("a header");
    assert_eq!(
        (header.alg, header.kid.as_deref()),
        (Algorithm::HS256, Some(oidc.kid()))
    );
    let mut naive = Validation::new(Algorithm::HS256);
    naive.set_audience(&[oidc.audience()]);
    let pem_as_secret = DecodingKey::from_secret(oidc.public_key_pem().as_bytes());
    jsonwebtoken::decode::<Value>(&confused, &pem_as_secret, &naive)
        .expect("HS256 over the public key's PEM");
    assert!(verify(&oidc, &confused).await.is_err());

    let unsigned = oidc.unsigned(oidc.claims_for("bob"));
    assert!(unsigned.ends_with('.'), "no signature: {unsigned}");
    assert_eq!(unverified_claims(&unsigned)["sub"], "bob");
    assert!(verify(&oidc, &unsigned).await.is_err());
}

#[tokio::test]
async fn rotating_keys_publishes_the_new_key_first_and_drops_the_old_unless_kept() {
    let Some(mut oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };
    let first = oidc.kid().to_owned();
    let issuer = oidc.issuer();
    let before = oidc.device_login("alice").await.access_token;

    oidc.rotate_keys(true).await;

    let second = oidc.kid().to_owned();
    assert_eq!(published_kids(&oidc).await, [second.clone(), first.clone()]);
    assert_eq!(oidc.retired_kid(), Some(first.as_str()));
    let after = oidc.device_login("alice").await.access_token;
    assert_eq!(kid_of(&after), second, "the new key signs");
    verify(&oidc, &after).await.expect("signed by the new key");
    verify(&oidc, &before)
        .await
        .expect("the kept key still verifies");
    let retired = oidc.sign_with_retired_key(oidc.claims_for("alice"));
    verify(&oidc, &retired)
        .await
        .expect("kept, so still published");

    oidc.rotate_keys(false).await;

    let third = oidc.kid().to_owned();
    assert_eq!(published_kids(&oidc).await, [third.as_str()]);
    assert_eq!(oidc.issuer(), issuer, "the same provider, restarted");
    assert_eq!(oidc.retired_kid(), Some(second.as_str()));
    let retired = oidc.sign_with_retired_key(oidc.claims_for("alice"));
    assert!(
        verify(&oidc, &retired)
            .await
            .is_err_and(|e| e.contains("no key"))
    );
    assert!(verify(&oidc, &before).await.is_err());
    let latest = oidc.device_login("bob").await.access_token;
    assert_eq!(kid_of(&latest), third);
    verify(&oidc, &latest)
        .await
        .expect("signed by the newest key");
}

/// Where the provider sends the console's browser when it asks to sign in: to its login page
/// (302/303 into the interaction) or, for a client it does not know, nowhere (an error page).
async fn console_sign_in_answer(oidc: &OidcProvider, redirect_uri: &str) -> reqwest::StatusCode {
    let discovery = oidc.discovery().await;
    let endpoint = discovery["authorization_endpoint"]
        .as_str()
        .expect("an endpoint");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client");
    browser
        .get(endpoint)
        .query(&[
            ("client_id", CONSOLE_CLIENT_ID),
            ("response_type", "code"),
            ("redirect_uri", redirect_uri),
            ("scope", "openid groups"),
            ("state", "a-state"),
            ("nonce", "a-nonce"),
            // RFC 7636's example challenge: any S256 challenge opens the login page.
            (
                "code_challenge",
                "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
            ),
            ("code_challenge_method", "S256"),
        ])
        .send()
        .await
        .expect("reach the authorization endpoint")
        .status()
}

#[tokio::test]
async fn the_console_client_exists_once_the_test_gives_its_redirect_uri() {
    let Some(mut oidc) = OidcProvider::start(OidcSetup::default()).await else {
        return;
    };
    let callback = "http://127.0.0.1:18080/console/callback";
    assert!(
        console_sign_in_answer(&oidc, callback)
            .await
            .is_client_error()
    );
    let kid = oidc.kid().to_owned();

    oidc.reconfigure(|setup| {
        *setup = setup
            .clone()
            .console_redirect(callback, "http://127.0.0.1:18080/console/login");
    })
    .await;

    assert!(
        console_sign_in_answer(&oidc, callback)
            .await
            .is_redirection()
    );
    assert!(
        console_sign_in_answer(&oidc, "http://127.0.0.1:18080/elsewhere")
            .await
            .is_client_error(),
        "only the registered redirect URI"
    );
    assert_eq!(oidc.kid(), kid, "the same keys");
}

-- The web console's sessions (api/src/console_sessions.rs): a person signed in through the
-- identity provider (or, while break-glass is on, with a pasted break-glass token) holds a
-- random secret in an HttpOnly cookie; this row is what it stands for. Only the secret's
-- SHA-256 is kept, so whoever reads the table (or a dump of it) cannot present a session.
--
-- A session is active while ended_at IS NULL, expires_at is in the future and last_seen_at is
-- within the idle timeout (PAYBUS_CONSOLE_IDLE_MINUTES); last_seen_at is written at most once
-- a minute. Signing out, or an ADMIN (POST /v1/admin/console-sessions/{id}/end), sets ended_*.
-- Roles are those the provider's claims gave at sign-in.
CREATE TABLE console_sessions (
    id                  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- What ADMINs list and end it by; never the cookie's secret.
    public_id           CHAR(36)        NOT NULL,
    secret_sha256       BINARY(32)      NOT NULL,
    issuer              VARCHAR(255)    NOT NULL,
    subject             VARCHAR(255)    NOT NULL,
    name                VARCHAR(255)    NOT NULL,
    -- OIDC, or BREAK_GLASS (paybus_platform::actor::AuthMethod).
    auth_method         VARCHAR(16)     NOT NULL,
    -- Comma-separated: ADMIN, OPS.
    roles               VARCHAR(64)     NOT NULL,
    created_at          TIMESTAMP(6)    NOT NULL,
    last_seen_at        TIMESTAMP(6)    NOT NULL,
    expires_at          TIMESTAMP(6)    NOT NULL,
    ended_at            TIMESTAMP(6)    NULL,
    ended_by            VARCHAR(255)    NULL,
    ended_by_issuer     VARCHAR(255)    NULL,
    ended_by_subject    VARCHAR(255)    NULL,
    PRIMARY KEY (id),
    UNIQUE KEY index_console_sessions_by_secret (secret_sha256),
    UNIQUE KEY index_console_sessions_by_public_id (public_id),
    -- The ADMINs' list: sessions not ended, newest first.
    KEY index_console_sessions_active (ended_at, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

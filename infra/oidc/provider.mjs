// panva's oidc-provider (OpenID Certified) configured as the company's identity provider for
// paybus's tests and local development. Usage: node provider.mjs CONFIG.json
//
// CONFIG.json (written by paybus_testkit::oidc, or by hand, see README.md):
//   issuer                    "http://127.0.0.1:<port>", the `iss` of every token
//   port                      the loopback port to listen on
//   audience                  the API's resource indicator (an absolute URI), the access tokens' `aud`
//   keys                      private signing JWKs, each with `kid`; the first one signs
//   users                     { "<login>": { "groups": [...], "email": "..." } }: nobody else signs in
//   clients                   client metadata as RFC 7591 names it
//   access_token_ttl_seconds  lifetime of the access tokens
//
// Prints `listening <issuer>` on stdout once it accepts connections. Its state (sessions,
// grants, refresh tokens) is in memory: a restart forgets it, as a key rotation in the test
// harness does on purpose.
import { readFileSync } from 'node:fs';

import Provider, { errors, interactionPolicy } from 'oidc-provider';

function fail(message) {
  console.error(`provider.mjs: ${message}`);
  process.exit(2);
}

function readConfig(path) {
  if (!path) fail('usage: node provider.mjs CONFIG.json');
  let config;
  try {
    config = JSON.parse(readFileSync(path, 'utf8'));
  } catch (error) {
    fail(`cannot read ${path}: ${error.message}`);
  }
  const { issuer, port, audience, keys, users, clients, access_token_ttl_seconds: ttl } = config;
  if (typeof issuer !== 'string' || !URL.canParse(issuer)) fail('issuer must be a URL');
  if (!Number.isInteger(port) || port <= 0 || port > 65535) fail('port must be a TCP port');
  // A resource indicator is an absolute URI (RFC 8707): a bare name would be refused per request.
  if (typeof audience !== 'string' || !URL.canParse(audience)) fail('audience must be an absolute URI');
  if (!Array.isArray(keys) || keys.length === 0 || !keys.every((key) => key.kid && key.d)) {
    fail('keys must be private JWKs, each with a kid');
  }
  if (!users || typeof users !== 'object') fail('users must map each login to its groups and email');
  if (!Array.isArray(clients)) fail('clients must be a list of client metadata');
  if (!Number.isInteger(ttl) || ttl <= 0) fail('access_token_ttl_seconds must be a positive integer');
  return config;
}

const config = readConfig(process.argv[2]);
const { issuer, port, audience, keys, users, clients } = config;
const accessTokenTTL = config.access_token_ttl_seconds;
const signingAlg = keys[0].alg ?? 'RS256';
const isUser = (id) => typeof id === 'string' && Object.hasOwn(users, id);

const userClaims = (id) => ({
  groups: users[id].groups ?? [],
  email: users[id].email,
  preferred_username: id,
});

// devInteractions' login page signs in whatever name is typed. A name that is not one of the
// configured users ends the authorization with access_denied (the client hears it, a device
// code is refused) instead of going on with an account the provider cannot find, which fails
// later inside the provider as a server error. Its session is dropped so the browser can
// sign in again as someone else.
const policy = interactionPolicy.base();
policy.get('login').checks.add(new interactionPolicy.Check(
  'unknown_account',
  'the login is not one of the configured users',
  'access_denied',
  async (ctx) => {
    const { accountId } = ctx.oidc.session;
    if (accountId && !isUser(accountId)) {
      await ctx.oidc.session.destroy();
      throw new errors.AccessDenied(`no such user: ${accountId}`);
    }
    return interactionPolicy.Check.NO_NEED_TO_PROMPT;
  },
));

const provider = new Provider(issuer, {
  clients,
  jwks: { keys },
  findAccount: async (ctx, id) => (isUser(id) ? {
    accountId: id,
    claims: async () => ({ sub: id, email_verified: true, ...userClaims(id) }),
  } : undefined),
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'offline_access', 'email', 'profile', 'groups'],
  responseTypes: ['code'],
  pkce: { required: () => true },
  interactions: { policy },
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator) => {
        if (indicator !== audience) throw new errors.InvalidTarget(`unknown resource: ${indicator}`);
        return {
          scope: 'groups',
          audience,
          accessTokenTTL,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: signingAlg } },
        };
      },
    },
  },
  // The API authorizes from the access token alone: who (`preferred_username`, `email`) and
  // which groups (the roles' source).
  extraTokenClaims: async (ctx, token) => {
    if (token.kind !== 'AccessToken' || !isUser(token.accountId)) return undefined;
    return userClaims(token.accountId);
  },
  ttl: {
    AccessToken: accessTokenTTL,
    AuthorizationCode: 60,
    DeviceCode: 600,
    Grant: 86400,
    IdToken: 3600,
    Interaction: 3600,
    RefreshToken: 86400,
    Session: 86400,
  },
});

// The provider answers a failure with a generic page or error code; its reason is only in
// these events, and a test reading the provider's output needs it.
for (const event of ['server_error', 'authorization.error', 'grant.error', 'end_session.error',
  'revocation.error', 'jwks.error', 'discovery.error', 'userinfo.error']) {
  provider.on(event, (ctx, error) => {
    console.error(`${event}: ${error.error ?? error.name}: ${error.error_description ?? error.message}`);
    if (event === 'server_error') console.error(error.stack);
  });
}

const server = provider.listen(port, '127.0.0.1', () => console.log(`listening ${issuer}`));
server.on('error', (error) => fail(`cannot listen on 127.0.0.1:${port}: ${error.message}`));

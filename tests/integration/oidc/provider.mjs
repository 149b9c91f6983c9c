// A real OpenID Connect provider for the console's tests: panva's oidc-provider (OpenID
// Certified), with its development login form, the clients and the accounts a test names.
//
//   node provider.mjs CONFIG.json
//
// CONFIG.json: {"clients": [oidc-provider client metadata...],
//               "accounts": {"alice": {"email": ..., "toolfleet_roles": [...], ...}, ...},
//               "resourceServers": ["http://127.0.0.1:PORT/mcp", ...],     (optional)
//               "tokenClaims": {"CLIENT_ID": {"toolfleet_roles": [...], ...}}} (optional)
// With resourceServers, a client may ask for a JWT access token for one of them (RFC 8707
// resource indicators; the client credentials grant for machine clients), carrying the
// tokenClaims of its client: what the MCP door's tests need of a provider.
// It listens on a free port of 127.0.0.1 and prints "oidc-provider: ISSUER" once it does.
// The login form takes any password: the account is the login name.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";

import Provider, { errors } from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const accounts = config.accounts;

const server = createServer();
server.listen(0, "127.0.0.1", () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  // A signing key of this run only: the console must fetch and use the provider's JWKS.
  const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const key = { ...privateKey.export({ format: "jwk" }), kid: randomBytes(8).toString("hex"), alg: "RS256", use: "sig" };
  const provider = new Provider(issuer, {
    clients: config.clients,
    jwks: { keys: [key] },
    cookies: { keys: [randomBytes(32).toString("hex")] },
    // Scope claims go to the userinfo endpoint (the ID token holds sub and the protocol's
    // claims), as many providers do: the console reads the roles from there.
    claims: {
      openid: ["sub"],
      email: ["email", "email_verified"],
      profile: ["name", "preferred_username"],
      toolfleet: ["toolfleet_roles", "toolfleet_tenants"],
    },
    async findAccount(_ctx, sub) {
      if (!Object.hasOwn(accounts, sub)) return undefined;
      return { accountId: sub, claims: async () => ({ sub, ...accounts[sub] }) };
    },
    features: {
      devInteractions: { enabled: true },
      rpInitiatedLogout: { enabled: true },
      ...(config.resourceServers ? resourceServerFeatures(config.resourceServers) : {}),
    },
    ...(config.tokenClaims
      ? { extraTokenClaims: async (_ctx, token) => config.tokenClaims[token.clientId] }
      : {}),
    pkce: { required: () => true },
  });
  provider.on("server_error", (_ctx, error) => console.error(`oidc-provider: ${error.stack}`));
  server.on("request", provider.callback());
  console.log(`oidc-provider: ${issuer}`);
});

// JWT access tokens for the listed resource servers only (their audience is the resource).
function resourceServerFeatures(resources) {
  return {
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => {
        if (!resources.includes(resource)) throw new errors.InvalidTarget();
        return { scope: "mcp", audience: resource, accessTokenFormat: "jwt", accessTokenTTL: 300 };
      },
    },
  };
}

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => server.close(() => process.exit(0)));
}

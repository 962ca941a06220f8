// A local, offline Sigstore instance for tests: @sigstore/mock's Fulcio CA (with its CT log) and
// Rekor log behind a plain Node HTTP server on 127.0.0.1.
//
//   node server.js --out DIR [--port N]
//
// Writes DIR/trusted_root.json (the CA root, CT log key and Rekor key: what a verifier needs,
// offline) and DIR/trust_config.json (the trusted root plus a signing config pointing at this
// server), then prints one JSON line {"url", "trusted_root", "trust_config"} on stdout.
//
// @sigstore/mock's Rekor embeds the *proposed* entry as the log body. That is what real Rekor
// stores for hashedrekord, but for dsse/0.0.1 Rekor stores a canonical form (hashes of the
// envelope and payload, and the signatures with their verifiers) that verifiers compare against.
// We compute that canonical body here before handing the entry to the mock log.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const path = require('path');
const { initializeCA, initializeCTLog, fulcioHandler, initializeTLog } = require('@sigstore/mock');

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

function keyPair() {
  return crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
}

function sha256(data) {
  return crypto.createHash('sha256').update(data).digest();
}

// Rekor's canonicalisation of a dsse/0.0.1 proposed entry (rekor pkg/types/dsse/v0.0.1).
function canonicalDsse(proposed) {
  const content = proposed.spec.proposedContent;
  const envelope = JSON.parse(content.envelope);
  const verifiers = content.verifiers;
  if (!Array.isArray(envelope.signatures) || envelope.signatures.length !== verifiers.length) {
    throw new Error('dsse: one verifier per signature expected');
  }
  return {
    apiVersion: '0.0.1',
    kind: 'dsse',
    spec: {
      envelopeHash: { algorithm: 'sha256', value: sha256(Buffer.from(content.envelope)).toString('hex') },
      payloadHash: {
        algorithm: 'sha256',
        value: sha256(Buffer.from(envelope.payload, 'base64')).toString('hex'),
      },
      signatures: envelope.signatures.map((s, i) => ({ signature: s.sig, verifier: verifiers[i] })),
    },
  };
}

function publicKeyEntry(der, start) {
  return {
    rawBytes: der.toString('base64'),
    keyDetails: 'PKIX_ECDSA_P256_SHA_256',
    validFor: { start },
  };
}

async function main() {
  const out = arg('out');
  if (!out) throw new Error('--out DIR is required');
  const port = Number(arg('port', '0'));

  const caKeys = keyPair();
  const rekorKeys = keyPair();
  const ctlog = await initializeCTLog(caKeys);
  const ca = await initializeCA(caKeys, ctlog);
  const fulcio = fulcioHandler(ca, { strict: true });

  const server = http.createServer();
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  const tlog = await initializeTLog(url, rekorKeys);

  async function rekor(body) {
    let proposed = JSON.parse(body);
    if (proposed.kind === 'dsse') proposed = canonicalDsse(proposed);
    const entry = await tlog.log(proposed);
    // Real Rekor names the new entry in ETag and Location; sigstore-go looks it up by ETag.
    const uuid = Object.keys(entry)[0];
    return {
      statusCode: 201,
      response: JSON.stringify(entry),
      contentType: 'application/json',
      headers: { ETag: uuid, Location: `/api/v1/log/entries/${uuid}` },
    };
  }

  // Real Fulcio takes the identity token from the Authorization header and the CSR as base64 of
  // its PEM text; the mock reads both from the body, the CSR as PEM. Translate.
  async function signingCert(body, headers) {
    const request = JSON.parse(body);
    const auth = headers.authorization || '';
    if (!request.credentials && auth.startsWith('Bearer ')) {
      request.credentials = { oidcIdentityToken: auth.slice('Bearer '.length) };
    }
    const csr = request.certificateSigningRequest;
    if (csr && !csr.startsWith('-----BEGIN')) {
      request.certificateSigningRequest = Buffer.from(csr, 'base64').toString();
    }
    const result = await fulcio.fn(JSON.stringify(request));
    // Real Fulcio (gRPC gateway) answers 200; sigstore-go insists on it, the mock says 201.
    return result.statusCode === 201 ? { ...result, statusCode: 200 } : result;
  }

  // Fulcio's v1 API (cosign 2): the public key as base64 DER in the body, the chain as PEM text.
  async function signingCertV1(body, headers) {
    const request = JSON.parse(body);
    const auth = headers.authorization || '';
    // The key arrives base64-encoded, as PEM text (cosign 2) or DER.
    const raw = Buffer.from(request.publicKey.content, 'base64');
    const pem = raw.toString().startsWith('-----BEGIN') ? raw.toString() : request.publicKey.content;
    const v2 = {
      credentials: { oidcIdentityToken: auth.slice('Bearer '.length) },
      publicKeyRequest: { publicKey: { content: pem } },
    };
    const result = await fulcio.fn(JSON.stringify(v2));
    if (result.statusCode !== 201) return result;
    const chain = JSON.parse(result.response).signedCertificateEmbeddedSct.chain.certificates;
    return { statusCode: 201, response: chain.join(''), contentType: 'application/pem-certificate-chain' };
  }

  const routes = {
    'POST /api/v1/signingCert': signingCertV1,
    'POST /api/v2/signingCert': signingCert,
    'POST /api/v1/log/entries': rekor,
  };

  server.on('request', (req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const route = routes[`${req.method} ${req.url.split('?')[0]}`];
      if (!route) {
        res.writeHead(404, { 'Content-Type': 'text/plain' });
        res.end('not found\n');
        return;
      }
      try {
        const { statusCode, response, contentType, headers } = await route(
          Buffer.concat(chunks).toString(),
          req.headers,
        );
        res.writeHead(statusCode, { 'Content-Type': contentType || 'text/plain', ...(headers || {}) });
        res.end(response);
      } catch (e) {
        res.writeHead(400, { 'Content-Type': 'text/plain' });
        res.end(String(e && e.message ? e.message : e));
      }
    });
  });

  // Keys count as valid from a day back, so clock skew between this server and the verifier
  // cannot make a fresh signature look older than its keys.
  const start = new Date(Date.now() - 24 * 3600 * 1000).toISOString();
  const caDer = ca.rootCertificate;
  const rekorDer = rekorKeys.publicKey.export({ format: 'der', type: 'spki' });
  const ctDer = caKeys.publicKey.export({ format: 'der', type: 'spki' });
  const trustedRoot = {
    mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
    tlogs: [
      {
        baseUrl: url,
        hashAlgorithm: 'SHA2_256',
        publicKey: publicKeyEntry(rekorDer, start),
        logId: { keyId: sha256(rekorDer).toString('base64') },
      },
    ],
    certificateAuthorities: [
      {
        subject: { organization: 'sigstore.mock', commonName: 'sigstore' },
        uri: url,
        certChain: { certificates: [{ rawBytes: Buffer.from(caDer).toString('base64') }] },
        validFor: { start },
      },
    ],
    ctlogs: [
      {
        baseUrl: url,
        hashAlgorithm: 'SHA2_256',
        publicKey: publicKeyEntry(ctDer, start),
        logId: { keyId: sha256(ctDer).toString('base64') },
      },
    ],
    timestampAuthorities: [],
  };
  const service = (u) => ({ url: u, majorApiVersion: 1, validFor: { start }, operator: 'kernelbake-tests' });
  const trustConfig = {
    mediaType: 'application/vnd.dev.sigstore.clienttrustconfig.v0.1+json',
    trustedRoot,
    signingConfig: {
      mediaType: 'application/vnd.dev.sigstore.signingconfig.v0.2+json',
      caUrls: [service(url)],
      oidcUrls: [],
      rekorTlogUrls: [service(url)],
      tsaUrls: [],
      rekorTlogConfig: { selector: 'ANY' },
      tsaConfig: { selector: 'ANY' },
    },
  };
  fs.mkdirSync(out, { recursive: true });
  const trustedRootPath = path.join(out, 'trusted_root.json');
  const trustConfigPath = path.join(out, 'trust_config.json');
  fs.writeFileSync(trustedRootPath, JSON.stringify(trustedRoot, null, 1));
  fs.writeFileSync(trustConfigPath, JSON.stringify(trustConfig, null, 1));
  process.stdout.write(JSON.stringify({ url, trusted_root: trustedRootPath, trust_config: trustConfigPath }) + '\n');

  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => {
  process.stderr.write(`mockserver: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});

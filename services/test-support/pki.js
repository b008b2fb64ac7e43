// Test helper (no tests here): a throwaway CA and certificates whose one name is a SPIFFE
// URI SAN, as complyroute/trust/pki.py issues them (EC P-256, usable as TLS server and client),
// made with the openssl command. Tests that need them are skipped where it is missing.
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export const OPENSSL = spawnSync('openssl', ['version'], { stdio: 'ignore' }).status === 0
export const NO_OPENSSL = !OPENSSL && 'the openssl command is not available'

const EC_P256 = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes']

function openssl (args) {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] })
}

/**
 * A CA in a temporary directory (removed by t.after). `issue(name, identity)` writes
 * `name.pem` and `name.key`, a certificate of this CA naming `identity`, and returns their
 * paths and contents; `ca` is the CA certificate's path.
 */
export function testPki (t, label = 'ca') {
  const dir = mkdtempSync(join(tmpdir(), 'complyroute-pki-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  const caCert = join(dir, `${label}.pem`)
  const caKey = join(dir, `${label}.key`)
  writeFileSync(join(dir, 'ca.cnf'), [
    '[req]', 'distinguished_name = dn', 'prompt = no', 'x509_extensions = ext',
    '[dn]', 'O = complyroute', `CN = ${label}`,
    '[ext]', 'basicConstraints = critical,CA:TRUE', 'keyUsage = critical,keyCertSign,cRLSign', 'subjectKeyIdentifier = hash'
  ].join('\n'))
  openssl(['req', '-x509', '-new', '-config', join(dir, 'ca.cnf'), ...EC_P256, '-keyout', caKey, '-out', caCert, '-days', '1'])

  // `san` replaces the default subjectAltName (URI:identity); `keyArgs` the key's options.
  function issue (name, identity, { san = `URI:${identity}`, keyArgs = EC_P256 } = {}) {
    const config = join(dir, `${name}.cnf`)
    writeFileSync(config, [
      '[req]', 'distinguished_name = dn', 'prompt = no', 'x509_extensions = ext',
      '[dn]', 'O = complyroute',
      '[ext]', 'basicConstraints = critical,CA:FALSE', 'keyUsage = critical,digitalSignature',
      'extendedKeyUsage = serverAuth,clientAuth', `subjectAltName = ${san}`,
      'subjectKeyIdentifier = hash', 'authorityKeyIdentifier = keyid'
    ].join('\n'))
    const cert = join(dir, `${name}.pem`)
    const key = join(dir, `${name}.key`)
    openssl(['req', '-x509', '-new', '-config', config, ...keyArgs, '-keyout', key, '-out', cert, '-days', '1', '-CA', caCert, '-CAkey', caKey])
    return { cert, key, ca: caCert, certPem: readFileSync(cert, 'utf8'), keyPem: readFileSync(key, 'utf8'), caPem: readFileSync(caCert, 'utf8'), identity }
  }

  return { dir, ca: caCert, issue }
}

/** The TLS_* variables of a credential from issue(). */
export function tlsEnv ({ cert, key, ca }) {
  return { TLS_CERT: cert, TLS_KEY: key, TLS_CA: ca }
}

/** undici connect options presenting a credential from issue() (no server name check). */
export function tlsClient ({ certPem, keyPem, caPem }) {
  return { ca: caPem, cert: certPem, key: keyPem, checkServerIdentity: () => undefined }
}

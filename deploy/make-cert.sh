#!/bin/sh
# Make the webhook's serving certificate: a private CA and a server certificate signed by it,
# with the Service's DNS names (the API server checks SANs, never the CN).
#
#   deploy/make-cert.sh --out DIR [--namespace kernelbake-system] [--service kernelbake-admission]
#                       [--dns NAME]... [--ip ADDR]... [--days 90] [--client NAME] [--keep-ca-key] [--apply]
#
# Writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key; with --client NAME also DIR/client.crt and
# DIR/client.key, a client-authentication certificate for the API server (`--client-ca ca.crt`).
# The CA's key is deleted once it has signed them (whoever holds it can mint certificates the
# webhooks trust): rotate by running this again; --keep-ca-key leaves it as DIR/ca.key. With
# --apply it also creates the Secret the Deployment mounts (ca.crt in it too) and writes the CA
# into both webhook configurations' caBundle (needs kubectl and the manifests applied). Without
# --apply it prints those commands. For rotation before expiry, cert-manager is the better tool.
set -eu

out="" ns="kernelbake-system" svc="kernelbake-admission" days=90 apply=0
extra_dns="" extra_ip="" client="" keep_ca_key=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --namespace) ns="$2"; shift 2 ;;
    --service) svc="$2"; shift 2 ;;
    --dns) extra_dns="$extra_dns $2"; shift 2 ;;
    --ip) extra_ip="$extra_ip $2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --client) client="$2"; shift 2 ;;
    --keep-ca-key) keep_ca_key=1; shift ;;
    --apply) apply=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make-cert.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "make-cert.sh: --out DIR is required" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-cert.sh: openssl is required" >&2; exit 3; }
mkdir -p "$out"
umask 077

san="DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local"
for d in $extra_dns; do san="$san,DNS:$d"; done
for i in $extra_ip; do san="$san,IP:$i"; done

openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days "$days" -subj "/CN=$svc webhook CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$out/tls.key" -out "$out/tls.csr" -subj "/CN=$svc.$ns.svc" 2>/dev/null
ext="$out/ext.cnf"
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$san" > "$ext"
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/tls.crt" -days "$days" -extfile "$ext" 2>/dev/null
wrote="$out/ca.crt $out/tls.crt $out/tls.key"
if [ -n "$client" ]; then
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$out/client.key" -out "$out/client.csr" -subj "/CN=$client" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' > "$ext"
  openssl x509 -req -in "$out/client.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -out "$out/client.crt" -days "$days" -extfile "$ext" 2>/dev/null
  chmod 644 "$out/client.crt"
  wrote="$wrote $out/client.crt $out/client.key"
fi
rm -f "$out/tls.csr" "$out/client.csr" "$ext" "$out/ca.srl"
if [ "$keep_ca_key" = 1 ]; then
  wrote="$wrote $out/ca.key (keep it offline)"
else
  rm -f "$out/ca.key"
fi
chmod 644 "$out/ca.crt" "$out/tls.crt"
echo "wrote $wrote (SANs: $san; $days days)"

bundle=$(base64 < "$out/ca.crt" | tr -d '\n')
secret="kubectl -n $ns create secret generic $svc-tls --type=kubernetes.io/tls --from-file=tls.crt=$out/tls.crt --from-file=tls.key=$out/tls.key --from-file=ca.crt=$out/ca.crt --dry-run=client -o yaml | kubectl apply -f -"
patch_v="kubectl patch validatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
patch_m="kubectl patch mutatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
if [ "$apply" = 1 ]; then
  sh -c "$secret" && sh -c "$patch_m" && sh -c "$patch_v"
else
  printf '\nnext:\n  %s\n  %s\n  %s\n' "$secret" "$patch_m" "$patch_v"
fi

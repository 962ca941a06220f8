#!/bin/sh
# Make the webhook's serving certificate: a private CA and a server certificate signed by it,
# with the Service's DNS names (the API server checks SANs, never the CN).
#
#   deploy/make-cert.sh --out DIR [--namespace kernelbake-system] [--service kernelbake-admission]
#                       [--dns NAME]... [--ip ADDR]... [--days 365] [--apply]
#
# Writes DIR/ca.crt, DIR/ca.key, DIR/tls.crt, DIR/tls.key. With --apply it also creates the
# Secret the Deployment mounts and writes the CA into both webhook configurations' caBundle
# (needs kubectl and the manifests applied). Without --apply it prints those commands.
set -eu

out="" ns="kernelbake-system" svc="kernelbake-admission" days=365 apply=0
extra_dns="" extra_ip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --namespace) ns="$2"; shift 2 ;;
    --service) svc="$2"; shift 2 ;;
    --dns) extra_dns="$extra_dns $2"; shift 2 ;;
    --ip) extra_ip="$extra_ip $2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --apply) apply=1; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
rm -f "$out/tls.csr" "$ext" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/tls.crt"
echo "wrote $out/ca.crt $out/tls.crt $out/tls.key (SANs: $san)"

bundle=$(base64 < "$out/ca.crt" | tr -d '\n')
secret="kubectl -n $ns create secret tls $svc-tls --cert=$out/tls.crt --key=$out/tls.key --dry-run=client -o yaml | kubectl apply -f -"
patch_v="kubectl patch validatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
patch_m="kubectl patch mutatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
if [ "$apply" = 1 ]; then
  sh -c "$secret" && sh -c "$patch_m" && sh -c "$patch_v"
else
  printf '\nnext:\n  %s\n  %s\n  %s\n' "$secret" "$patch_m" "$patch_v"
fi

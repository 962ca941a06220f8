#!/bin/sh
# Make the webhook's certificates: a private CA, a server certificate signed by it with the
# Service's DNS names (the API server checks SANs, never the CN), and the API server's client
# certificate, which the webhook requires (`kernelbake admission --client-ca ca.crt`).
#
#   deploy/make-cert.sh --out DIR [--namespace kernelbake-system] [--service kernelbake-admission]
#                       [--dns NAME]... [--ip ADDR]... [--days 90] [--client NAME]
#                       [--apiserver-dir /etc/kubernetes/kernelbake] [--keep-ca-key] [--apply]
#
# Writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key, the client certificate DIR/client.crt and
# DIR/client.key (CN kube-apiserver, or --client NAME), and what the API server needs to show
# it: DIR/apiserver/admission-configuration.yaml (pass its path under --apiserver-dir to
# kube-apiserver --admission-control-config-file) and DIR/apiserver/kubeconfig.yaml (the client
# certificate and key inline, for the user named after the Service), both to copy to
# --apiserver-dir on every control-plane node. The CA's key is deleted once it has signed them
# (whoever holds it can mint certificates the webhook trusts): rotate by running this again;
# --keep-ca-key leaves it as DIR/ca.key. With --apply it also creates the Secret the Deployment
# mounts (ca.crt in it too) and writes the CA into both webhook configurations' caBundle (needs
# kubectl and the manifests applied). Without --apply it prints those commands. For rotation
# before expiry, cert-manager is the better tool.
set -eu

out="" ns="kernelbake-system" svc="kernelbake-admission" days=90 apply=0
extra_dns="" extra_ip="" client="kube-apiserver" keep_ca_key=0 apiserver_dir="/etc/kubernetes/kernelbake"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --namespace) ns="$2"; shift 2 ;;
    --service) svc="$2"; shift 2 ;;
    --dns) extra_dns="$extra_dns $2"; shift 2 ;;
    --ip) extra_ip="$extra_ip $2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --client) client="$2"; shift 2 ;;
    --apiserver-dir) apiserver_dir="$2"; shift 2 ;;
    --keep-ca-key) keep_ca_key=1; shift ;;
    --apply) apply=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "make-cert.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "make-cert.sh: --out DIR is required" >&2; exit 2; }
[ -n "$client" ] || { echo "make-cert.sh: --client NAME: the API server's certificate needs a name" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-cert.sh: openssl is required" >&2; exit 3; }
mkdir -p "$out/apiserver"
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
# The API server's client certificate: for client authentication only, so that neither it nor
# the serving certificate can stand in for the other.
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$out/client.key" -out "$out/client.csr" -subj "/CN=$client" 2>/dev/null
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' > "$ext"
openssl x509 -req -in "$out/client.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/client.crt" -days "$days" -extfile "$ext" 2>/dev/null
rm -f "$out/tls.csr" "$out/client.csr" "$ext" "$out/ca.srl"
wrote="$out/ca.crt $out/tls.crt $out/tls.key $out/client.crt $out/client.key"
if [ "$keep_ca_key" = 1 ]; then
  wrote="$wrote $out/ca.key (keep it offline)"
else
  rm -f "$out/ca.key"
fi

# The API server picks a webhook's client credentials by the host it calls: <service>.<namespace>.svc
# for a Service on port 443 (deploy/webhooks.yaml).
user="$svc.$ns.svc"
{
  echo "# kube-apiserver --admission-control-config-file=$apiserver_dir/admission-configuration.yaml"
  echo "# (where the API server already has one, add the two plugins' entries to it)."
  echo "apiVersion: apiserver.config.k8s.io/v1"
  echo "kind: AdmissionConfiguration"
  echo "plugins:"
  for plugin in ValidatingAdmissionWebhook MutatingAdmissionWebhook; do
    echo "  - name: $plugin"
    echo "    configuration:"
    echo "      apiVersion: apiserver.config.k8s.io/v1"
    echo "      kind: WebhookAdmissionConfiguration"
    echo "      kubeConfigFile: $apiserver_dir/kubeconfig.yaml"
  done
} > "$out/apiserver/admission-configuration.yaml"
{
  echo "# The client certificate the API server shows to $user (make-cert.sh; $days days)."
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "users:"
  echo "  - name: $user"
  echo "    user:"
  echo "      client-certificate-data: $(base64 < "$out/client.crt" | tr -d '\n')"
  echo "      client-key-data: $(base64 < "$out/client.key" | tr -d '\n')"
} > "$out/apiserver/kubeconfig.yaml"
chmod 644 "$out/ca.crt" "$out/tls.crt" "$out/client.crt" "$out/apiserver/admission-configuration.yaml"
wrote="$wrote $out/apiserver/admission-configuration.yaml $out/apiserver/kubeconfig.yaml"
echo "wrote $wrote (SANs: $san; client $client; $days days)"

bundle=$(base64 < "$out/ca.crt" | tr -d '\n')
secret="kubectl -n $ns create secret generic $svc-tls --type=kubernetes.io/tls --from-file=tls.crt=$out/tls.crt --from-file=tls.key=$out/tls.key --from-file=ca.crt=$out/ca.crt --dry-run=client -o yaml | kubectl apply -f -"
patch_v="kubectl patch validatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
patch_m="kubectl patch mutatingwebhookconfiguration $svc --type=json -p '[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]'"
apiserver="on every control-plane node: copy $out/apiserver/*.yaml to $apiserver_dir/ and run kube-apiserver with --admission-control-config-file=$apiserver_dir/admission-configuration.yaml"
if [ "$apply" = 1 ]; then
  sh -c "$secret" && sh -c "$patch_m" && sh -c "$patch_v"
  printf '\nthen, %s (until it shows the certificate, the webhook refuses its reviews)\n' "$apiserver"
else
  printf '\nnext:\n  %s\n  %s\n  %s\n  %s\n' "$secret" "$patch_m" "$patch_v" "$apiserver"
fi

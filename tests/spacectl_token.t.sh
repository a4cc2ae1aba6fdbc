#!/bin/sh
# run-tests: light, about 4 s
# spacectl token / cap against the official PASETO v4.public vectors and the
# capability round trip (C1, C2, C5, R6).
#   env: SPACED_BUILD (absolute build dir), SPACED_TOP (repo root)
set -u
build=${SPACED_BUILD:?SPACED_BUILD is not set}
ctl="$build/spacectl/spacectl"
[ -x "$ctl" ] || { echo "FAIL: $ctl not built"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "python3 missing"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0
pass() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# hex -> PASERK (unpadded base64url)
paserk() { python3 -c 'import base64,sys; print(sys.argv[1] + base64.urlsafe_b64encode(bytes.fromhex(sys.argv[2])).decode().rstrip("="))' "$1" "$2"; }

# ---- the 4-S vectors (transcribed) ----
SECRET_HEX=b4cbfb43df4ce210727d953e4a713307fa19bb7d9f85041438d9e11b942a37741eb9dbbbbc047c03fd70604e0071f0987e16b28b757225c11f00415d0e20b1a2
PUBLIC_HEX=1eb9dbbbbc047c03fd70604e0071f0987e16b28b757225c11f00415d0e20b1a2
PAYLOAD='{"data":"this is a signed message","exp":"2022-01-01T00:00:00+00:00"}'
FOOTER='{"kid":"zVhMiPBP9fRf2snEcT7gFTioeA9COcNy9DfgL1W60haN"}'
BODY=eyJkYXRhIjoidGhpcyBpcyBhIHNpZ25lZCBtZXNzYWdlIiwiZXhwIjoiMjAyMi0wMS0wMVQwMDowMDowMCswMDowMCJ9
FOOT64=eyJraWQiOiJ6VmhNaVBCUDlmUmYyc25FY1Q3Z0ZUaW9lQTlDT2NOeTlEZmdMMVc2MGhhTiJ9
S1="v4.public.${BODY}bg_XBBzds8lTZShVlwwKSgeKpLT3yukTw6JUz3W4h_ExsQV-P0V54zemZDcAxFaSeef1QlXEFtkqxT1ciiQEDA"
S2="v4.public.${BODY}v3Jt8mx_TdM2ceTGoqwrh4yDFn0XsHvvV_D0DtwQxVrJEBMl0F2caAdgnpKlt4p7xBnx1HcO-SPo8FPp214HDw.${FOOT64}"
S3="v4.public.${BODY}NPWciuD3d0o5eXJXG5pJy-DiVEoyPYWs1YSTwWHNJq6DZD3je5gf-0M4JR9ipdUSJbIovzmBECeaWmaqcaP0DQ.${FOOT64}"
I3='{"test-vector":"4-S-3"}'

F1="v4.local.vngXfCISbnKgiP6VWGuOSlYrFYU300fy9ijW33rznDYgxHNPwWluAY2Bgb0z54CUs6aYYkIJ-bOOOmJHPuX_34Agt_IPlNdGDpRdGNnBz2MpWJvB3cttheEc1uyCEYltj7wBQQYX.YXJiaXRyYXJ5LXN0cmluZy10aGF0LWlzbid0LWpzb24"
F2="v4.public.eyJpbnZhbGlkIjoidGhpcyBzaG91bGQgbmV2ZXIgZGVjb2RlIn22Sp4gjCaUw0c7EH84ZSm_jN_Qr41MrgLNu5LIBCzUr1pn3Z-Wukg9h3ceplWigpoHaTLcwxj0NsI1vjTh67YB.${FOOT64}"
F3="v3.local.23e_2PiqpQBPvRFKzB0zHhjmxK3sKo2grFZRRLM-U7L0a8uHxuF9RlVz3Ic6WmdUUWTxCaYycwWV1yM8gKbZB2JhygDMKvHQ7eBf8GtF0r3K0Q_gF1PXOxcOgztak1eD1dPe9rLVMSgR0nHJXeIGYVuVrVoLWQ.YXJiaXRyYXJ5LXN0cmluZy10aGF0LWlzbid0LWpzb24"
F4="v4.local.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAr68PS4AXe7If_ZgesdkUMvSwscFlAl1pk5HC0e8kApeaqMfGo_7OpBnwJOAbY9V7WU6abu74MmcUE8YWAiaArVI8XJ5hOb_4v9RmDkneN0S92dx0OW4pgy7omxgf3S8c3LlQh"
F5="v4.local.32VIErrEkmY4JVILovbmfPXKW9wT1OdQepjMTC_MOtjA4kiqw7_tcaOM5GNEcnTxl60WkwMsYXw6FSNb_UdJPXjpzm0KW9ojM5f4O2mRvE2IcweP-PRdoHjd5-RHCiExR1IK6t4x-RMNXtQNbz7FvFZ_G-lFpk5RG3EOrwDL6CgDqcerSQ==.${FOOT64}"

SK=$(paserk k4.secret. "$SECRET_HEX")
PK=$(paserk k4.public. "$PUBLIC_HEX")
[ ${#SK} -eq 96 ] && [ ${#PK} -eq 53 ] || { echo "FAIL: PASERK conversion"; exit 1; }

# ---- sign: byte for byte ----
check_sign() { # name expected args...
	name=$1; want=$2; shift 2
	got=$("$ctl" token sign --key "$SK" "$@" "$PAYLOAD") || { bad "$name: sign exited non-zero"; return; }
	[ "$got" = "$want" ] && pass "$name signed byte for byte" || bad "$name: got $got"
}
check_sign 4-S-1 "$S1"
check_sign 4-S-2 "$S2" --footer "$FOOTER"
check_sign 4-S-3 "$S3" --footer "$FOOTER" --implicit "$I3"
# payload from standard input
got=$(printf '%s' "$PAYLOAD" | "$ctl" token sign --key "$SK" -)
[ "$got" = "$S1" ] && pass "4-S-1 signed from stdin" || bad "4-S-1 from stdin: $got"

# ---- verify: payload printed ----
check_verify() { # name token args...
	name=$1; tok=$2; shift 2
	got=$("$ctl" token verify --key "$PK" "$@" "$tok") || { bad "$name: verify exited non-zero"; return; }
	[ "$got" = "$PAYLOAD" ] && pass "$name verified, payload printed" || bad "$name: printed $got"
}
check_verify 4-S-1 "$S1"
check_verify 4-S-2 "$S2" --footer "$FOOTER"
check_verify 4-S-2-no-expected-footer "$S2"
check_verify 4-S-3 "$S3" --footer "$FOOTER" --implicit "$I3"
got=$(printf '%s\n' "$S3" | "$ctl" token verify --key "$PK" --implicit "$I3" -)
[ "$got" = "$PAYLOAD" ] && pass "4-S-3 verified from stdin" || bad "4-S-3 from stdin: $got"

# ---- refusals: non-zero exit and a reason ----
check_refused() { # name token reason args...
	name=$1; tok=$2; reason=$3; shift 3
	if "$ctl" token verify --key "$PK" "$@" "$tok" >"$tmp/out" 2>"$tmp/err"; then
		bad "$name accepted"
	elif [ -s "$tmp/out" ]; then
		bad "$name: printed a payload although refused"
	elif grep -q "$reason" "$tmp/err"; then
		pass "$name refused: $(cat "$tmp/err")"
	else
		bad "$name: reason not given (wanted $reason): $(cat "$tmp/err")"
	fi
}
check_refused 4-F-1 "$F1" SPACED_EHEADER --implicit '{"test-vector":"4-F-1"}'
check_refused 4-F-2 "$F2" SPACED_ESIG --footer "$FOOTER" --implicit '{"test-vector":"4-F-2"}'
check_refused 4-F-3 "$F3" SPACED_EHEADER --implicit '{"test-vector":"4-F-3"}'
check_refused 4-F-4 "$F4" SPACED_EHEADER
check_refused 4-F-5 "$F5" SPACED_EHEADER --footer "$FOOTER"
check_refused 4-S-3-without-implicit "$S3" SPACED_ESIG
check_refused 4-S-2-wrong-footer "$S2" SPACED_EFOOTER --footer '{"kid":"other"}'
check_refused 4-S-1-trailing-dot "$S1." SPACED_EFORMAT

# a secret key offered for verification is a key-type error
if "$ctl" token verify --key "$SK" "$S1" >/dev/null 2>"$tmp/err"; then
	bad "k4.secret accepted as a verification key"
elif grep -q "wrong key version or type" "$tmp/err"; then
	pass "k4.secret refused as a verification key"
else
	bad "k4.secret as verification key: $(cat "$tmp/err")"
fi

# ---- keygen round trip ----
"$ctl" token keygen >"$tmp/keys" || bad "keygen failed"
ksec=$(sed -n 's/^secret: //p' "$tmp/keys")
kpub=$(sed -n 's/^public: //p' "$tmp/keys")
kkid=$(sed -n 's/^kid: *//p' "$tmp/keys")
case "$ksec" in k4.secret.*) [ ${#ksec} -eq 96 ] || bad "keygen secret length ${#ksec}" ;; *) bad "keygen secret: $ksec" ;; esac
case "$kpub" in k4.public.*) [ ${#kpub} -eq 53 ] || bad "keygen public length ${#kpub}" ;; *) bad "keygen public: $kpub" ;; esac
case "$kkid" in k4.pid.*) [ ${#kkid} -eq 51 ] || bad "keygen kid length ${#kkid}" ;; *) bad "keygen kid: $kkid" ;; esac
t=$("$ctl" token sign --key "$ksec" --footer f --implicit i "hello keygen") || bad "sign with generated key"
got=$("$ctl" token verify --key "$kpub" --footer f --implicit i "$t") || bad "verify with generated key"
[ "$got" = "hello keygen" ] && pass "keygen output round trips through sign/verify" || bad "keygen round trip: $got"
if "$ctl" token verify --key "$PK" "$t" >/dev/null 2>&1; then bad "token verified under another key"; else pass "generated token refused under another key"; fi
"$ctl" token keygen --json >"$tmp/keys.json" || bad "keygen --json failed"
python3 - "$tmp/keys.json" <<'EOF' && pass "keygen --json parses" || bad "keygen --json output"
import json, sys
k = json.load(open(sys.argv[1]))
assert set(k) == {"secret", "public", "kid"}, k
assert k["secret"].startswith("k4.secret.") and k["public"].startswith("k4.public.") and k["kid"].startswith("k4.pid.")
EOF
jsec=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["secret"])' "$tmp/keys.json")
jpub=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["public"])' "$tmp/keys.json")
t=$("$ctl" token sign --key "$jsec" "json keys")
[ "$("$ctl" token verify --key "$jpub" "$t")" = "json keys" ] && pass "keygen --json keys round trip" || bad "keygen --json round trip"

# ---- capabilities: issue, inspect, check ----
cap=$("$ctl" cap issue --key "$ksec" --sandbox sbx-1 --generation 7 --worker worker-a --activation act-1 \
	--purpose exec --purpose fs.read) || bad "cap issue failed"
case "$cap" in v4.public.*.*) pass "cap issue produced a token with a footer" ;; *) bad "cap issue: $cap" ;; esac

"$ctl" cap inspect "$cap" >"$tmp/insp" 2>&1
grep -q '^status: UNVERIFIED' "$tmp/insp" && pass "inspect without a key: UNVERIFIED" || bad "inspect without key: $(cat "$tmp/insp")"
grep -q '"sub": "sbx-1"' "$tmp/insp" || bad "inspect does not show the claims"
grep -q "$kkid" "$tmp/insp" && pass "inspect shows the footer kid" || bad "inspect footer: $(cat "$tmp/insp")"

if "$ctl" cap inspect --key "$kpub" "$cap" >"$tmp/insp" 2>&1 && grep -q '^status: VERIFIED' "$tmp/insp"; then
	pass "inspect with the right key: VERIFIED"
else
	bad "inspect with the right key: $(cat "$tmp/insp")"
fi
if "$ctl" cap inspect --key "$PK" "$cap" >"$tmp/insp" 2>&1; then
	bad "inspect with another key exited 0: $(cat "$tmp/insp")"
elif grep -q '^status: REFUSED' "$tmp/insp" && grep -q 'unknown-key' "$tmp/insp"; then
	pass "inspect with another key: REFUSED (unknown-key), non-zero exit"
else
	bad "inspect with another key: $(cat "$tmp/insp")"
fi
"$ctl" cap inspect --json --key "$kpub" "$cap" >"$tmp/insp.json" 2>&1
python3 - "$tmp/insp.json" <<'EOF' && pass "inspect --json" || bad "inspect --json: $(cat "$tmp/insp.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"] == "VERIFIED", d
assert d["claims"]["generation"] == 7 and d["claims"]["class"] == "control", d
EOF

id7="sandbox=sbx-1;generation=7;worker=worker-a;substrate=process;activation=act-1;pod_uid="
id6="sandbox=sbx-1;generation=6;worker=worker-a;substrate=process;activation=act-1;pod_uid="
id8="sandbox=sbx-1;generation=8;worker=worker-a;substrate=process;activation=act-1;pod_uid="
idother="sandbox=sbx-2;generation=7;worker=worker-a;substrate=process;activation=act-1;pod_uid="
check_cap() { # name expected-output expected-exit args...
	name=$1; want=$2; wantrc=$3; shift 3
	got=$("$ctl" cap check --key "$kpub" "$@" "$cap" 2>"$tmp/err"); rc=$?
	if [ "$got" = "$want" ] && [ "$rc" -eq "$wantrc" ]; then
		pass "cap check $name: $got"
	else
		bad "cap check $name: '$got' exit $rc (wanted '$want' exit $wantrc) $(cat "$tmp/err")"
	fi
}
check_cap installed "ALLOW ok" 0 --installed "$id7" --purpose exec
check_cap "R2 older installed" "REFRESH_ROUTE newer-generation" 1 --installed "$id6" --purpose exec
check_cap "R3 newer installed" "REFRESH_ROUTE older-generation" 1 --installed "$id8" --purpose exec
check_cap tombstone "REFRESH_ROUTE deactivated" 1 --installed "$id7" --tombstone --purpose exec
check_cap "other sandbox" "DENY other-sandbox" 1 --installed "$idother" --purpose exec
check_cap "C5 purpose not granted" "DENY wrong-purpose" 1 --installed "$id6" --purpose term
got=$("$ctl" cap check --key "$PK" --installed "$id7" --purpose exec "$cap" 2>/dev/null); rc=$?
[ "$got" = "DENY unknown-key" ] && [ "$rc" -ne 0 ] && pass "cap check under another key: $got" || bad "cap check other key: '$got' exit $rc"

# serviceport
sp=$("$ctl" cap issue --key "$ksec" --sandbox sbx-1 --generation 7 --worker worker-a --activation act-1 \
	--purpose serviceport --port 8080 --protocol http) || bad "serviceport cap issue failed"
got=$("$ctl" cap check --key "$kpub" --installed "$id7" --purpose serviceport --port 8080 --protocol http "$sp")
[ "$got" = "ALLOW ok" ] && pass "serviceport cap: $got" || bad "serviceport cap: $got"
got=$("$ctl" cap check --key "$kpub" --installed "$id7" --purpose serviceport --port 8081 --protocol http "$sp")
[ "$got" = "DENY wrong-port" ] && pass "serviceport cap, other port: $got" || bad "serviceport other port: $got"
got=$("$ctl" cap check --key "$kpub" --installed "$id7" --purpose exec "$sp")
[ "$got" = "DENY wrong-purpose" ] && pass "serviceport cap presented as control: $got" || bad "serviceport as control: $got"
if "$ctl" cap issue --key "$ksec" --sandbox sbx-1 --generation 7 --worker w --purpose serviceport >/dev/null 2>&1; then
	bad "serviceport capability issued without port and protocol"
else
	pass "serviceport capability without port/protocol refused at issue"
fi
if "$ctl" cap issue --key "$kpub" --sandbox sbx-1 --generation 7 --worker w --purpose exec >/dev/null 2>&1; then
	bad "cap issued with a public key"
else
	pass "cap issue refuses a k4.public as signing key"
fi

exit $fail

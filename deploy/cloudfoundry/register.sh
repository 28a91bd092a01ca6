#!/usr/bin/env bash
# Register the scoperouter broker with Cloud Foundry and open its plans, idempotently: the
# first run creates the broker, later runs update it (a new URL, password or catalog).
#
#   export SCOPEROUTER_BROKER_URL=https://broker.example.org
#   export CF_BROKER_PASSWORD=...            # the broker's basic-auth password
#   deploy/cloudfoundry/register.sh [--name NAME] [--username USER] [--org ORG] [--space-scoped]
#
# Needs the cf CLI v7 or v8, logged in (`cf login`) as an admin, or with --space-scoped as a
# space developer of the targeted space. The password goes to cf in its environment
# (CF_BROKER_PASSWORD), never on a command line, where ps and shell history would show it.
# Undo: delete the service instances, then `cf delete-service-broker NAME -f`.
set -euo pipefail

name=scoperouter
username=broker
org=""
space_scoped=false

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit "$1"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --name) name=${2:?--name needs a value}; shift ;;
        --username) username=${2:?--username needs a value}; shift ;;
        --org) org=${2:?--org needs a value}; shift ;;
        --space-scoped) space_scoped=true ;;
        -h | --help) usage 0 ;;
        *) echo "register.sh: unknown argument: $1" >&2; usage 2 ;;
    esac
    shift
done

url=${SCOPEROUTER_BROKER_URL:?set SCOPEROUTER_BROKER_URL: where Cloud Foundry reaches the broker}
: "${CF_BROKER_PASSWORD:?set CF_BROKER_PASSWORD: the basic-auth password of the broker}"
export CF_BROKER_PASSWORD
command -v cf >/dev/null || { echo "register.sh: the cf CLI is not on PATH" >&2; exit 1; }

# The v3 API answers with JSON whose pagination says whether a broker of that name exists (the
# tables of `cf service-brokers` are meant for people, not scripts). cf failing (not logged in)
# stops the script here, with cf's message.
found=$(cf curl "/v3/service_brokers?names=${name}")
if ! grep -q '"total_results"' <<<"$found"; then
    echo "register.sh: cf curl /v3/service_brokers did not answer a list (logged in?):" >&2
    echo "$found" >&2
    exit 1
fi
if grep -Eq '"total_results": *0([^0-9]|$)' <<<"$found"; then
    echo "register.sh: creating service broker ${name} at ${url}"
    if [ "$space_scoped" = true ]; then
        cf create-service-broker "$name" "$username" "$url" --space-scoped
    else
        cf create-service-broker "$name" "$username" "$url"
    fi
else
    echo "register.sh: updating service broker ${name} at ${url}"
    cf update-service-broker "$name" "$username" "$url"
fi

# A space-scoped broker's plans are visible in its space already. A global broker's plans are
# opened to every organisation, or to --org only; enable-service-access is idempotent.
if [ "$space_scoped" = false ]; then
    for service in openstack-project openstack-server openstack-image; do
        if [ -n "$org" ]; then
            cf enable-service-access "$service" -b "$name" -o "$org"
        else
            cf enable-service-access "$service" -b "$name"
        fi
    done
fi
cf service-access -b "$name"

"""Translates a SAM template into the CloudFormation template AWS would deploy, offline, with
AWS SAM's own translator (aws-sam-translator, the library `sam deploy` and CloudFormation's
AWS::Serverless transform run), and prints it as JSON.

    .local/aws-venv/bin/python infra/aws/translate.py infra/aws/template.yaml > translated.json

Offline as cfn-lint translates (infra/aws/tools.sh lint installs both): local `CodeUri`s
become placeholder S3 locations (the translator accepts nothing else; the code is not part
of the translation) and the managed policies' ARNs come from the copy cfn-lint ships instead
of IAM. The template is read as plain YAML: intrinsic functions must be in their long form
(`Ref:`, `Fn::Sub:`), as `paybus template` writes them.
"""

import json
import os
import sys

import yaml
from cfnlint.data import Serverless
from cfnlint.helpers import load_resource
from samtranslator.parser import parser
from samtranslator.translator.translator import Translator


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} TEMPLATE", file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as file:
        template = yaml.safe_load(file)
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource.setdefault("Properties", {})["CodeUri"] = "s3://paybus-offline/code.zip"
    # The translator builds ARNs for the region it runs in; any region will do offline.
    os.environ.setdefault("AWS_DEFAULT_REGION", "eu-central-1")
    translator = Translator(
        managed_policy_map=load_resource(Serverless, "ManagedPolicies.json"),
        sam_parser=parser.Parser(),
    )
    translated = translator.translate(sam_template=template, parameter_values={})
    json.dump(translated, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

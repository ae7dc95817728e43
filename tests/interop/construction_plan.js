// Prints the SQL that Node pg-boss 11.1.2 itself runs, for the golden tests.
//
//   node construction_plan.js SCHEMA
//       the construction plan (getConstructionPlans), as text
//   node construction_plan.js SCHEMA[,SCHEMA...] '[["create-queue", NAME, OPTIONS], ["delete-queue", NAME]]'
//       a JSON object: for each schema, the statements the client sends for those calls
'use strict'

const PgBoss = require('pg-boss')
const plans = require('pg-boss/src/plans')

const [schema, calls] = process.argv.slice(2)
if (!schema) {
  console.error('usage: node construction_plan.js SCHEMA [CALLS_JSON]')
  process.exit(2)
}

if (calls === undefined) {
  process.stdout.write(PgBoss.getConstructionPlans(schema))
} else {
  const statements = {}
  for (const one of schema.split(',')) {
    statements[one] = JSON.parse(calls).map(([action, name, options]) => {
      if (action === 'create-queue') {
        // The manager fills in the policy before building the statement.
        const filled = { ...options, policy: (options && options.policy) || 'standard' }
        return plans.createQueue(one, name, filled)
      }
      if (action === 'delete-queue') return plans.deleteQueue(one, name)
      throw new Error(`unknown action ${action}`)
    })
  }
  process.stdout.write(JSON.stringify(statements))
}
